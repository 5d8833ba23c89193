// Where everything is. Each setting comes from a flag, else an environment variable, else a
// default on 127.0.0.1; the same names work for `troupe up` and for one service at a time.
import { parseArgs } from "node:util";
import path from "node:path";

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
  /** Extra positional arguments after the flags. */
  rest: string[];
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
    rest: positionals,
    flags: values as Record<string, string | boolean | string[] | undefined>,
  };
}

/** The base URL the runner's model client uses: the configured endpoint, else the scripted server. */
export const modelBaseUrl = (c: Config): string => c.openaiBaseUrl || `http://${c.addr.model}/v1`;
