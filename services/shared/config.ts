// Troupe's configuration: the one module that reads the environment. Each setting comes from a
// flag, else an environment variable, else a default (addresses on 127.0.0.1); the same names work
// for `troupe up` and for one service at a time. ENVIRONMENT lists every variable read here: a
// TROUPE_* variable not in it is reported (a typo must not be silently ignored), and
// `troupe config` prints them all with the values in force, secrets masked.
import { parseArgs } from "node:util";
import path from "node:path";
import { quotasFromEnv, type Quotas } from "./quotas.js";

export interface Addresses {
  gateway: string;
  router: string;
  runner: string;
  memory: string;
  sandbox: string;
  /** The scripted model server (HTTP). */
  model: string;
}

export interface Config {
  addr: Addresses;
  dataDir: string;
  /** Largest gRPC message any server accepts (RESOURCE_EXHAUSTED beyond). */
  maxMessageBytes: number;
  /** How long a draining server waits for running calls. */
  drainGraceMs: number;
  /** Runner: its id, and the address the gateway should dial (defaults to addr.runner). */
  runnerId: string;
  advertise: string;
  /** Model endpoint; empty means "use the scripted model server". */
  openaiBaseUrl: string;
  openaiApiKey: string;
  model: string;
  /**
   * Runner: a runner whose heartbeat in the shared store is older than this is presumed dead, and
   * its sessions may be taken over by another runner.
   */
  runnerLivenessMs: number;
  /** Runner: sessions with nothing to do leave memory after this long (reloaded from their log). */
  passivateAfterMs: number;
  /** How many memories a run's system prompt gets (0: memory is not consulted). */
  memoryContextK: number;
  /** Per-agent folders: agent.json, workspace files (AGENTS.md, SOUL.md, IDENTITY.md), skills/. */
  agentsDir: string;
  /** Plugin modules (comma-separated paths) that register hooks and threat checks. */
  hookModules: string[];
  /** The shortest heartbeat interval a schedule may ask for. */
  minHeartbeatSeconds: number;
  /** Default tool timeout for sandbox exec. */
  execTimeoutMs: number;
  /** Sandbox image and container runtime (runc or runsc). */
  sandboxImage: string;
  sandboxRuntime: string;
  /** Sandbox: a session's container unused for this long is removed (made anew on next use). */
  sandboxIdleMs: number;
  /** Sandbox: no container lives longer than this. */
  sandboxMaxAgeMs: number;
  /** Sandbox: how many started, unclaimed containers wait for new sessions (0: none). */
  sandboxPoolSize: number;
  /** Sandbox: who shares a container: each session, each agent, or everyone. */
  sandboxScope: "session" | "agent" | "shared";
  /** Gateway: the API keys file (hashed keys, each with its tenant and principal; see auth.ts). */
  apiKeysFile: string;
  /** Router: the routing configuration (bindings, dm_scope, identity links; see router/bindings.ts). */
  routingFile: string;
  /** Per-tenant quotas (shared/quotas.ts); a missing file means the defaults. */
  quotasFile: string;
  /** The quotas every tenant has unless the quotas file says otherwise. */
  quotaDefaults: Quotas;
  /** Gateway: message rates and open streams per tenant and session. */
  limits: LimitsConfig;
  /** Gateway: API keys given as JSON in the environment, beside the keys file. */
  apiKeysJson: string;
  /** Clients (troupe chat): the API key to send; empty means the data directory's development key. */
  clientApiKey: string;
  /** The token between services; empty means the data directory's (made on first use). */
  internalToken: string;
  logLevel: LogLevel;
  /** Runner: failpoints (runner/failpoints.ts), for tests. */
  failpoints: string;
  /** Runner: learning from each completed turn. */
  memoryLearn: boolean;
  /** Memory: where the table lives (any LanceDB URI) and its storage options. */
  memoryUri: string;
  memoryStorageOptions: Record<string, string>;
  /** Memory: an embedding model at the model endpoint, and its vector size; empty: the built-in embedder. */
  embeddingModel: string;
  embeddingDim: number;
  /** The scripted model server: tokens per second of every reply (0: as fast as the client reads). */
  scriptedTokenRate: number;
  /** Sandbox: the Docker engine's address, as dockerode reads it (for messages). */
  dockerHost: string;
  /** Tracing (OTLP over HTTP); no endpoint: tracing is off. */
  otel: {
    endpoint: string;
    serviceName: string;
    batch: Record<"scheduleDelay" | "exportTimeout" | "maxQueueSize" | "maxExportBatchSize", number | undefined>;
  };
  /** Extra positional arguments after the flags. */
  rest: string[];
}

export type LogLevel = "debug" | "info" | "warn" | "error";
const LOG_LEVELS: readonly LogLevel[] = ["debug", "info", "warn", "error"];

export interface LimitsConfig {
  /** Messages per second a tenant may send, on average, and in a burst. */
  tenantRate: number;
  tenantBurst: number;
  /** The same for one session. */
  sessionRate: number;
  sessionBurst: number;
  /** Streams a tenant may hold open at once. */
  tenantStreams: number;
}

/**
 * A session's burst is above its mailbox (100 waiting messages): a burst meets the mailbox's own
 * refusal first, which is an event on a stream that stays open; the rate limit is for sustained
 * floods, which end the stream.
 */
export const DEFAULT_LIMITS: LimitsConfig = {
  tenantRate: 1000,
  tenantBurst: 2000,
  sessionRate: 20,
  sessionBurst: 200,
  tenantStreams: 20_000,
};

/** Every environment variable Troupe reads: name, what it sets, and whether its value is secret. */
export const ENVIRONMENT: readonly { name: string; doc: string; secret?: boolean }[] = [
  { name: "TROUPE_DATA_DIR", doc: "state: session logs, memory, keys (--data-dir)" },
  { name: "TROUPE_GATEWAY_ADDR", doc: "gateway address (--gateway)" },
  { name: "TROUPE_ROUTER_ADDR", doc: "router address (--router)" },
  { name: "TROUPE_RUNNER_ADDR", doc: "runner address (--runner)" },
  { name: "TROUPE_MEMORY_ADDR", doc: "memory address (--memory)" },
  { name: "TROUPE_SANDBOX_ADDR", doc: "sandbox address (--sandbox)" },
  { name: "TROUPE_MODEL_SERVER_ADDR", doc: "scripted model server address (--model-server)" },
  { name: "TROUPE_MAX_MESSAGE_BYTES", doc: "largest gRPC message accepted (--max-message-bytes)" },
  { name: "TROUPE_DRAIN_GRACE_MS", doc: "drain grace on SIGTERM (--drain-grace-ms)" },
  { name: "TROUPE_RUNNER_ID", doc: "runner id (--runner-id)" },
  { name: "TROUPE_RUNNER_ADVERTISE", doc: "address the gateway dials for this runner (--advertise)" },
  { name: "TROUPE_RUNNER_LIVENESS_MS", doc: "a runner silent this long is presumed dead" },
  { name: "TROUPE_PASSIVATE_AFTER_MS", doc: "idle sessions leave memory after" },
  { name: "TROUPE_ROUTING_FILE", doc: "routing bindings and session keys" },
  { name: "TROUPE_QUOTAS_FILE", doc: "quotas per tenant" },
  { name: "TROUPE_API_KEYS_FILE", doc: "the gateway's keys file (--api-keys)" },
  { name: "TROUPE_API_KEYS", doc: "API keys as JSON, beside the keys file" },
  { name: "TROUPE_API_KEY", doc: "the key a client sends", secret: true },
  { name: "TROUPE_INTERNAL_TOKEN", doc: "the token between services", secret: true },
  { name: "TROUPE_MODEL", doc: "the model of agents that name none" },
  { name: "OPENAI_BASE_URL", doc: "model endpoint (unset: the scripted model)" },
  { name: "OPENAI_API_KEY", doc: "model endpoint key", secret: true },
  { name: "TROUPE_AGENTS_DIR", doc: "agents' agent.json, workspace files, skills" },
  { name: "TROUPE_MIN_HEARTBEAT_S", doc: "shortest heartbeat interval" },
  { name: "TROUPE_HOOKS", doc: "hook plugin modules, comma-separated" },
  { name: "TROUPE_MEMORY_CONTEXT_K", doc: "memories in a run's prompt (0: off)" },
  { name: "TROUPE_MEMORY_LEARN", doc: "learning from each turn (0: off)" },
  { name: "TROUPE_MEMORY_URI", doc: "memory store (any LanceDB URI)" },
  { name: "TROUPE_MEMORY_STORAGE_OPTIONS", doc: "memory store options (JSON)", secret: true },
  { name: "TROUPE_EMBEDDING_MODEL", doc: "embedding model at the model endpoint" },
  { name: "TROUPE_EMBEDDING_DIM", doc: "its vector size" },
  { name: "TROUPE_EXEC_TIMEOUT_MS", doc: "sandbox exec timeout" },
  { name: "TROUPE_SANDBOX_IMAGE", doc: "sandbox image" },
  { name: "TROUPE_SANDBOX_RUNTIME", doc: "sandbox runtime (runc or runsc)" },
  { name: "TROUPE_SANDBOX_IDLE_MS", doc: "an unused sandbox is removed after" },
  { name: "TROUPE_SANDBOX_MAX_AGE_MS", doc: "no sandbox lives longer than" },
  { name: "TROUPE_SANDBOX_POOL", doc: "warm sandboxes (0: none)" },
  { name: "TROUPE_SANDBOX_SCOPE", doc: "who shares a sandbox: session, agent or shared" },
  { name: "TROUPE_TENANT_RATE", doc: "messages a second per tenant" },
  { name: "TROUPE_TENANT_BURST", doc: "burst per tenant" },
  { name: "TROUPE_SESSION_RATE", doc: "messages a second per session" },
  { name: "TROUPE_SESSION_BURST", doc: "burst per session" },
  { name: "TROUPE_TENANT_STREAMS", doc: "open streams per tenant" },
  ...Object.keys(quotasFromEnv({})).map((k) => ({
    name: `TROUPE_QUOTA_${k.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`,
    doc: `default quota: ${k}`,
  })),
  { name: "TROUPE_LOG_LEVEL", doc: "debug, info, warn or error" },
  { name: "TROUPE_FAILPOINTS", doc: "failpoints (tests)" },
  { name: "TROUPE_SCRIPTED_TOKEN_RATE", doc: "the scripted model's tokens a second" },
  { name: "UV_THREADPOOL_SIZE", doc: "libuv threads (services default to 16)" },
  { name: "DOCKER_HOST", doc: "the Docker engine (dockerode reads it)" },
  { name: "OTEL_EXPORTER_OTLP_ENDPOINT", doc: "tracing endpoint (unset: off)" },
  { name: "OTEL_SERVICE_NAME", doc: "service name in traces (default troupe-<service>)" },
  { name: "OTEL_BSP_SCHEDULE_DELAY", doc: "span batch delay" },
  { name: "OTEL_BSP_EXPORT_TIMEOUT", doc: "span export timeout" },
  { name: "OTEL_BSP_MAX_QUEUE_SIZE", doc: "span queue size" },
  { name: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", doc: "span batch size" },
];

/** TROUPE_* variables set but not read: typos, or settings of another version. */
export function unknownVariables(env: NodeJS.ProcessEnv = process.env): string[] {
  const known = new Set(ENVIRONMENT.map((e) => e.name));
  return Object.keys(env).filter((k) => k.startsWith("TROUPE_") && !known.has(k) && !k.startsWith("TROUPE_TEST_"));
}

/** The variables of ENVIRONMENT that are set, as `troupe config` shows them: secrets masked. */
export function effectiveEnvironment(
  env: NodeJS.ProcessEnv = process.env,
): { name: string; value: string; doc: string }[] {
  return ENVIRONMENT.map((e) => {
    const v = env[e.name];
    const value = v === undefined ? "(unset)" : e.secret ? (v === "" ? "" : "****") : v;
    return { name: e.name, value, doc: e.doc };
  });
}

/** The environment handed to the processes a supervisor starts (troupe up): this one's. */
export const childEnvironment = (): NodeJS.ProcessEnv => process.env;

/**
 * Session logs fsync on every acknowledgement; with libuv's default of 4 threads, a burst of new
 * sessions queues behind a handful of disk syncs. Call before the thread pool first starts.
 */
export function widenThreadPool(): void {
  process.env.UV_THREADPOOL_SIZE ??= "16";
}

function positiveNumber(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined || value === "") return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} must be a positive number, got "${value}"`);
  return n;
}

const DEFAULTS = {
  gateway: "127.0.0.1:50051",
  router: "127.0.0.1:50052",
  runner: "127.0.0.1:50053",
  memory: "127.0.0.1:50054",
  sandbox: "127.0.0.1:50055",
  model: "127.0.0.1:50060",
};

export const FLAG_OPTIONS = {
  "data-dir": { type: "string" },
  gateway: { type: "string" },
  router: { type: "string" },
  runner: { type: "string" },
  memory: { type: "string" },
  sandbox: { type: "string" },
  "model-server": { type: "string" },
  "runner-id": { type: "string" },
  advertise: { type: "string" },
  "max-message-bytes": { type: "string" },
  "drain-grace-ms": { type: "string" },
  "api-keys": { type: "string" },
} as const;

function positiveInt(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined || value === "") return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name} must be a positive integer, got "${value}"`);
  return n;
}

function logLevel(value: string | undefined): LogLevel {
  if (value === undefined || value === "") return "info";
  if ((LOG_LEVELS as readonly string[]).includes(value)) return value as LogLevel;
  throw new Error(`TROUPE_LOG_LEVEL must be one of ${LOG_LEVELS.join(", ")}, got "${value}"`);
}

function jsonObject(name: string, value: string | undefined): Record<string, string> {
  if (!value) return {};
  try {
    const doc = JSON.parse(value) as unknown;
    if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new Error("not an object");
    return doc as Record<string, string>;
  } catch (err) {
    throw new Error(`${name} must be a JSON object: ${(err as Error).message}`);
  }
}

/** The OTel SDK's convention: a positive integer, else unset. */
function optionalInt(value: string | undefined): number | undefined {
  const n = Number(value);
  return Number.isInteger(n) && n > 0 ? n : undefined;
}

function sandboxScope(value: string | undefined): Config["sandboxScope"] {
  if (value === undefined || value === "") return "session";
  if (value === "session" || value === "agent" || value === "shared") return value;
  throw new Error(`TROUPE_SANDBOX_SCOPE must be session, agent or shared, got "${value}"`);
}

export function loadConfig(
  argv: string[],
  env: NodeJS.ProcessEnv = process.env,
  extra: Record<string, { type: "string" | "boolean"; short?: string; multiple?: boolean }> = {},
): Config & { flags: Record<string, string | boolean | string[] | undefined> } {
  const { values, positionals } = parseArgs({
    args: argv,
    options: { ...FLAG_OPTIONS, ...extra },
    allowPositionals: true,
    strict: true,
  });
  const v = values as Record<string, string | undefined>;
  const addr: Addresses = {
    gateway: v.gateway ?? env.TROUPE_GATEWAY_ADDR ?? DEFAULTS.gateway,
    router: v.router ?? env.TROUPE_ROUTER_ADDR ?? DEFAULTS.router,
    runner: v.runner ?? env.TROUPE_RUNNER_ADDR ?? DEFAULTS.runner,
    memory: v.memory ?? env.TROUPE_MEMORY_ADDR ?? DEFAULTS.memory,
    sandbox: v.sandbox ?? env.TROUPE_SANDBOX_ADDR ?? DEFAULTS.sandbox,
    model: v["model-server"] ?? env.TROUPE_MODEL_SERVER_ADDR ?? DEFAULTS.model,
  };
  const dataDir = path.resolve(v["data-dir"] ?? env.TROUPE_DATA_DIR ?? "./data");
  return {
    addr,
    dataDir,
    routingFile: path.resolve(env.TROUPE_ROUTING_FILE ?? path.join(dataDir, "routing.json")),
    quotasFile: path.resolve(env.TROUPE_QUOTAS_FILE ?? path.join(dataDir, "quotas.json")),
    apiKeysFile: path.resolve(v["api-keys"] ?? env.TROUPE_API_KEYS_FILE ?? path.join(dataDir, "auth", "api-keys.json")),
    maxMessageBytes: positiveInt(
      "--max-message-bytes",
      v["max-message-bytes"] ?? env.TROUPE_MAX_MESSAGE_BYTES,
      4 * 1024 * 1024,
    ),
    drainGraceMs: positiveInt("--drain-grace-ms", v["drain-grace-ms"] ?? env.TROUPE_DRAIN_GRACE_MS, 10_000),
    runnerId: v["runner-id"] ?? env.TROUPE_RUNNER_ID ?? `runner-${addr.runner}`,
    advertise: v.advertise ?? env.TROUPE_RUNNER_ADVERTISE ?? addr.runner,
    openaiBaseUrl: env.OPENAI_BASE_URL ?? "",
    openaiApiKey: env.OPENAI_API_KEY ?? "",
    model: env.TROUPE_MODEL ?? "scripted-1",
    runnerLivenessMs: positiveInt("TROUPE_RUNNER_LIVENESS_MS", env.TROUPE_RUNNER_LIVENESS_MS, 10_000),
    passivateAfterMs: positiveInt("TROUPE_PASSIVATE_AFTER_MS", env.TROUPE_PASSIVATE_AFTER_MS, 600_000),
    agentsDir: path.resolve(env.TROUPE_AGENTS_DIR ?? path.join(dataDir, "agents")),
    minHeartbeatSeconds: positiveInt("TROUPE_MIN_HEARTBEAT_S", env.TROUPE_MIN_HEARTBEAT_S, 10),
    hookModules: (env.TROUPE_HOOKS ?? "")
      .split(",")
      .map((s) => s.trim())
      .filter((s) => s !== "")
      .map((s) => path.resolve(s)),
    memoryContextK:
      env.TROUPE_MEMORY_CONTEXT_K === "0" ? 0 : positiveInt("TROUPE_MEMORY_CONTEXT_K", env.TROUPE_MEMORY_CONTEXT_K, 5),
    execTimeoutMs: positiveInt("TROUPE_EXEC_TIMEOUT_MS", env.TROUPE_EXEC_TIMEOUT_MS, 60_000),
    sandboxImage: env.TROUPE_SANDBOX_IMAGE ?? "troupe-sandbox:busybox",
    sandboxRuntime: env.TROUPE_SANDBOX_RUNTIME ?? "runc",
    sandboxIdleMs: positiveInt("TROUPE_SANDBOX_IDLE_MS", env.TROUPE_SANDBOX_IDLE_MS, 30 * 60_000),
    sandboxMaxAgeMs: positiveInt("TROUPE_SANDBOX_MAX_AGE_MS", env.TROUPE_SANDBOX_MAX_AGE_MS, 24 * 3600_000),
    sandboxPoolSize:
      env.TROUPE_SANDBOX_POOL === "0" ? 0 : positiveInt("TROUPE_SANDBOX_POOL", env.TROUPE_SANDBOX_POOL, 2),
    sandboxScope: sandboxScope(env.TROUPE_SANDBOX_SCOPE),
    quotaDefaults: quotasFromEnv(env),
    limits: {
      tenantRate: positiveNumber("TROUPE_TENANT_RATE", env.TROUPE_TENANT_RATE, DEFAULT_LIMITS.tenantRate),
      tenantBurst: positiveNumber("TROUPE_TENANT_BURST", env.TROUPE_TENANT_BURST, DEFAULT_LIMITS.tenantBurst),
      sessionRate: positiveNumber("TROUPE_SESSION_RATE", env.TROUPE_SESSION_RATE, DEFAULT_LIMITS.sessionRate),
      sessionBurst: positiveNumber("TROUPE_SESSION_BURST", env.TROUPE_SESSION_BURST, DEFAULT_LIMITS.sessionBurst),
      tenantStreams: positiveNumber("TROUPE_TENANT_STREAMS", env.TROUPE_TENANT_STREAMS, DEFAULT_LIMITS.tenantStreams),
    },
    apiKeysJson: env.TROUPE_API_KEYS ?? "",
    clientApiKey: env.TROUPE_API_KEY ?? "",
    internalToken: env.TROUPE_INTERNAL_TOKEN ?? "",
    logLevel: logLevel(env.TROUPE_LOG_LEVEL),
    failpoints: env.TROUPE_FAILPOINTS ?? "",
    memoryLearn: env.TROUPE_MEMORY_LEARN !== "0",
    memoryUri: env.TROUPE_MEMORY_URI || path.join(dataDir, "memory"),
    memoryStorageOptions: jsonObject("TROUPE_MEMORY_STORAGE_OPTIONS", env.TROUPE_MEMORY_STORAGE_OPTIONS),
    embeddingModel: env.TROUPE_EMBEDDING_MODEL ?? "",
    embeddingDim: env.TROUPE_EMBEDDING_MODEL
      ? positiveInt(
          "TROUPE_EMBEDDING_DIM (needed with TROUPE_EMBEDDING_MODEL: the model's vector size)",
          env.TROUPE_EMBEDDING_DIM || "none",
          0,
        )
      : 0,
    scriptedTokenRate: env.TROUPE_SCRIPTED_TOKEN_RATE
      ? positiveNumber("TROUPE_SCRIPTED_TOKEN_RATE", env.TROUPE_SCRIPTED_TOKEN_RATE, 0)
      : 0,
    dockerHost: env.DOCKER_HOST ?? "/var/run/docker.sock",
    otel: {
      endpoint: env.OTEL_EXPORTER_OTLP_ENDPOINT ?? "",
      serviceName: env.OTEL_SERVICE_NAME ?? "",
      batch: {
        scheduleDelay: optionalInt(env.OTEL_BSP_SCHEDULE_DELAY),
        exportTimeout: optionalInt(env.OTEL_BSP_EXPORT_TIMEOUT),
        maxQueueSize: optionalInt(env.OTEL_BSP_MAX_QUEUE_SIZE),
        maxExportBatchSize: optionalInt(env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE),
      },
    },
    rest: positionals,
    flags: values as Record<string, string | boolean | string[] | undefined>,
  };
}

/** The base URL the runner's model client uses: the configured endpoint, else the scripted server. */
export const modelBaseUrl = (c: Config): string => c.openaiBaseUrl || `http://${c.addr.model}/v1`;
