// What a loaded configuration holds (config.ts loads it from flags and the environment;
// settings.ts declares where each value comes from). Types only, so that a module that is handed
// a Config does not load the loader.
import type { Quotas } from "../auth/quotas.js";
import type { OutboundProxy } from "../net/outbound-proxy.js";

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
  /** The PostgreSQL store (shared/pg.ts); empty: the file store in dataDir. */
  storeUrl: string;
  /** Largest gRPC message any server accepts (RESOURCE_EXHAUSTED beyond). */
  maxMessageBytes: number;
  /** How long a draining server waits for running calls. */
  drainGraceMs: number;
  /** Idle time after which a process gives its unused heap back (idle-trim.ts); 0: never. */
  idleTrimMs: number;
  /** Runner: its id, and the address the gateway should dial (defaults to addr.runner). */
  runnerId: string;
  advertise: string;
  /** Model endpoint; empty means "use the scripted model server". */
  openaiBaseUrl: string;
  openaiApiKey: string;
  /** OPENAI_ORG_ID, OPENAI_PROJECT_ID: the default provider's account headers. */
  openaiAccount: { organization?: string; project?: string };
  model: string;
  /** Runner: how often sessions idle past their agent's retentionDays are deleted. */
  retentionSweepMs: number;
  /** The providers file (shared/models/providers.ts); empty: one provider from openaiBaseUrl. */
  providersFile: string;
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
  /** Gateway: the HTTP face (gateway/http/edge.ts); empty: none. */
  httpAddr: string;
  /** Gateway: origins allowed to call the HTTP API from a browser ("*": any). */
  httpCors: string[];
  /** Gateway: deadlines and a cap for the HTTP face's connections (gateway/http/connection-guard.ts). */
  httpConnections: {
    firstByteMs: number;
    headMs: number;
    bodyMs: number;
    idleMs: number;
    maxConnections: number;
  };
  /** /new and /reset in a chat: the old conversation stays in the history, or is deleted. */
  channelReset: "keep" | "delete";
  /** Runner: what web_fetch and http_request may reach (shared/net/net-guard.ts). */
  net: { ports: number[]; allow: string[] };
  /** Runner: the secrets http_request may send, by name ({"NAME": "value"}). */
  secretsFile: string;
  /** The shortest heartbeat interval a schedule may ask for. */
  minHeartbeatSeconds: number;
  /** Default tool timeout for sandbox exec. */
  execTimeoutMs: number;
  /** Sandbox image and container runtime (runc or runsc). */
  sandboxImage: string;
  /** Other images agents may name for their sandboxes (agent.json workspace.image). */
  sandboxImages: string[];
  /** Where snapshots are kept: "" (the data directory), a path, or an s3:// URL. */
  sandboxSnapshots: string;
  sandboxRuntime: string;
  /** Sandbox: a session's container unused for this long is removed (made anew on next use). */
  sandboxIdleMs: number;
  /** Sandbox: no container lives longer than this. */
  sandboxMaxAgeMs: number;
  /** Sandbox: how many started, unclaimed containers wait for new sessions (0: none). */
  sandboxPoolSize: number;
  /** Sandbox: whether a workspace is kept past its container (saved and restored) or goes with it. */
  sandboxWorkspaces: "kept" | "discarded";
  /** Sandbox: who shares a container: each session, each agent, or everyone. */
  sandboxScope: "session" | "agent" | "shared";
  /** Gateway: TLS certificate and key files; undefined: plain gRPC. */
  tls?: { certFile: string; keyFile: string };
  /** Clients: a CA (PEM file) to trust over TLS; empty: plain gRPC unless --tls. */
  tlsCa: string;
  /** Between services: TLS trusting this CA (PEM file), each serving with `tls`; empty: plain gRPC. */
  internalCa: string;
  /** Gateway: the API keys file (hashed keys, each with its tenant and principal; see auth.ts). */
  apiKeysFile: string;
  /** Router: the routing configuration (bindings, dm_scope, identity links; see router/bindings.ts). */
  routingFile: string;
  /** Per-tenant quotas (shared/auth/quotas.ts); a missing file means the defaults. */
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
  logFormat: "auto" | "json" | "text";
  /** troupe up: the C allocator its services start with (services/cli/allocator.ts). */
  allocator: "auto" | "jemalloc" | "system";
  /** Which of V8's compilers each service runs with, and when (services/cli/jit.ts). */
  jit: "auto" | "on" | "lean";
  /** troupe adapter (services/adapter): "" where unset. */
  adapter: {
    stateFile: string;
    webhookAddr: string;
    webhookSecret: string;
    webhookReplyUrl: string;
    telegramBotToken: string;
    telegramApiUrl: string;
    telegramWebhookUrl: string;
    telegramWebhookSecret: string;
    slackBotToken: string;
    slackSigningSecret: string;
    slackAppToken: string;
    slackApiUrl: string;
    commandUsers: string[];
    /** Unset: the adapter's own default (cli/adapter.ts). */
    dmPolicy?: "open" | "allowlist" | "pairing";
    allowFrom: string[];
    draftIntervalMs: number;
    slackSocketRefreshMs: number;
  };
  /** Runner: failpoints (runner/loop/failpoints.ts), for tests. */
  failpoints: string;
  /** Runner: learning from each completed turn. */
  memoryLearn: boolean;
  /** Memory: where the table lives (any LanceDB URI) and its storage options. */
  memoryUri: string;
  memoryStorageOptions: Record<string, string>;
  /** LanceDB's metadata cache cap (memory/meta.ts). */
  memoryMetadataCacheMb: number;
  memoryIndexCacheMb: number;
  /** Commits between two reopenings of the memory database (memory/maintenance.ts reconnect). */
  memoryReconnectCommits: number;
  /** Memory: an embedding model at the model endpoint, and its vector size; empty: the built-in embedder. */
  embeddingModel: string;
  embeddingDim: number;
  /** Memory: the model learning asks what to keep (empty: the model). */
  learningModel: string;
  /** The scripted model server: tokens per second of every reply (0: as fast as the client reads). */
  scriptedTokenRate: number;
  /** Sandbox: the Docker engine's address, as DOCKER_HOST gives it; empty: found (sandbox/engine-address.ts). */
  dockerHost: string;
  /** Sandbox: TLS to a tcp:// engine, with the certificates of dockerCertPath. */
  dockerTlsVerify: boolean;
  dockerCertPath: string;
  /** Sandbox: the docker context (DOCKER_CONTEXT) and the docker config directory (DOCKER_CONFIG). */
  dockerContext: string;
  dockerConfigDir: string;
  /** XDG_RUNTIME_DIR (a rootless engine's socket) and the home directory (Docker Desktop's). */
  runtimeDir: string;
  homeDir: string;
  /** SSH_AUTH_SOCK, for an ssh:// engine. */
  sshAuthSock: string;
  /** Prometheus' /metrics on this host:port; empty: none. */
  metricsAddr: string;
  /** HTTPS_PROXY, HTTP_PROXY and NO_PROXY for outbound calls (outbound-proxy.ts); unset: direct. */
  outboundProxy?: OutboundProxy;
  /** Metrics go to the OTLP endpoint too (OTEL_METRICS_EXPORTER, OTEL_SDK_DISABLED). */
  metricsToOtlp: boolean;
  /**
   * What startTelemetry needs to decide; the OTel SDK reads the standard variables itself
   * (headers, sampler, resource attributes, batching), after they were checked here.
   */
  otel: {
    /** Spans are exported: an endpoint or a non-OTLP exporter is set, and the SDK is not disabled. */
    tracing: boolean;
    /** OTEL_SERVICE_NAME, or empty for troupe-<service>. */
    serviceName: string;
    protocol: "http/protobuf" | "http/json" | "grpc";
  };
  /** Extra positional arguments after the flags. */
  rest: string[];
}

export type LogLevel = "debug" | "info" | "warn" | "error";

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
