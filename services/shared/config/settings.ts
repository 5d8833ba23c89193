// Every setting Troupe has, declared once, in a section per service: its environment variable,
// its flag if it has one, its default, what it sets, and its shape (setting-kinds.ts checks values
// against it, turning a variable's text into the number a shape asks for). A
// default in <angle brackets> is worked out from other settings when the configuration loads.
// The five services' sections are here; tracing, the clients and the channel adapters have files
// of their own beside it. docs/settings.md's table is settingsTable()'s, and a unit test
// keeps it so.
import { ADAPTER_SETTINGS, CLIENT_SETTINGS } from "./client-settings.js";
import { DEFAULT_QUOTAS } from "../auth/quotas.js";
import { address, int, oneOf, positive, type Setting } from "./setting-kinds.js";
import { TELEMETRY_SETTINGS } from "./telemetry-settings.js";

export type { Setting };

/** A proxy's URL; without a scheme it is http:// (curl's reading, and how many hosts set it). */
const proxyUrl = {
  type: "string",
  pattern: "^(https?://)?[^/?#\\s]+/?$",
  message: "must be an http:// or https:// URL of the proxy (http://host:port)",
} as const;

const quotaEnv = (k: string) => `TROUPE_QUOTA_${k.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`;

export const SETTINGS = {
  "every service": {
    dataDir: { env: "TROUPE_DATA_DIR", flag: "data-dir", doc: "state: session logs, memory, keys", default: "./data" },
    storeUrl: {
      env: "TROUPE_STORE_URL",
      flag: "store-url",
      doc: "PostgreSQL for sessions, schedules, profiles, audit and runner membership (unset: files in the data directory)",
      schema: { type: "string", pattern: "^postgres(ql)?://", message: "must be a postgres:// or postgresql:// URL" },
      secret: true,
    },
    gateway: address("TROUPE_GATEWAY_ADDR", "gateway", "gateway", 50051),
    router: address("TROUPE_ROUTER_ADDR", "router", "router", 50052),
    runner: address("TROUPE_RUNNER_ADDR", "runner", "runner", 50053),
    memory: address("TROUPE_MEMORY_ADDR", "memory", "memory", 50054),
    sandbox: address("TROUPE_SANDBOX_ADDR", "sandbox", "sandbox", 50055),
    maxMessageBytes: {
      env: "TROUPE_MAX_MESSAGE_BYTES",
      flag: "max-message-bytes",
      doc: "largest gRPC message accepted (RESOURCE_EXHAUSTED beyond)",
      default: 4 * 1024 * 1024,
      schema: int(),
    },
    drainGraceMs: {
      env: "TROUPE_DRAIN_GRACE_MS",
      flag: "drain-grace-ms",
      doc: "how long a draining server waits for running calls (SIGTERM)",
      default: 10_000,
      schema: int(),
    },
    providersFile: {
      env: "TROUPE_PROVIDERS_FILE",
      flag: "providers",
      doc: "model providers (providers.json; unset: one provider from OPENAI_BASE_URL)",
    },
    internalToken: {
      env: "TROUPE_INTERNAL_TOKEN",
      doc: "the token between services",
      default: "<data-dir>/auth/internal-token",
      secret: true,
    },
    internalCa: {
      env: "TROUPE_INTERNAL_TLS_CA",
      flag: "internal-ca",
      doc: "TLS between services, trusting this CA (PEM): each serves TLS with --tls-cert/--tls-key, and calls the others over TLS",
    },
    quotasFile: {
      env: "TROUPE_QUOTAS_FILE",
      doc: "quotas per tenant (docs/security.md, Quotas)",
      default: "<data-dir>/quotas.json",
    },
    logLevel: {
      env: "TROUPE_LOG_LEVEL",
      doc: "log level",
      default: "info",
      schema: oneOf("debug", "info", "warn", "error"),
    },
    logFormat: {
      env: "TROUPE_LOG_FORMAT",
      flag: "log-format",
      doc: "json (a line of JSON per record) or text; auto: text on a terminal, else json",
      default: "auto",
      schema: oneOf("auto", "json", "text"),
    },
    idleTrimMs: {
      env: "TROUPE_IDLE_TRIM_MS",
      doc: "after this long with its event loop idle, a process that grew hands its unused JavaScript heap back to the system (one full collection); 0: never",
      default: 5000,
      schema: int(0),
    },
    httpsProxy: {
      env: "HTTPS_PROXY",
      lowerCase: true,
      doc: "an HTTP proxy for outbound calls to https:// model providers, chat APIs, the agents' web tools and sandbox egress (docs/architecture.md, outbound calls); never for calls between Troupe's services",
      schema: proxyUrl,
      secret: true,
    },
    httpProxy: {
      env: "HTTP_PROXY",
      lowerCase: true,
      doc: "the same for http:// ones, and for https:// ones too when HTTPS_PROXY is unset",
      schema: proxyUrl,
      secret: true,
    },
    noProxy: {
      env: "NO_PROXY",
      lowerCase: true,
      doc: "hosts outbound calls reach directly: names, .domain suffixes, host:port, or *, comma-separated (localhost, 127.0.0.1 and ::1 always)",
    },
    threadPool: {
      env: "UV_THREADPOOL_SIZE",
      doc: "libuv threads (session logs fsync on them)",
      default: 16,
      schema: int(),
    },
    allocator: {
      env: "TROUPE_ALLOCATOR",
      doc: "the C allocator every service process runs on: jemalloc (libjemalloc.so.2, Debian's libjemalloc2), system (glibc's), or auto: jemalloc where installed",
      default: "auto",
      schema: oneOf("auto", "jemalloc", "system"),
    },
    jit: {
      env: "TROUPE_JIT",
      doc: "V8's compilers: auto runs the router on the interpreter alone (10 to 12 MB smaller; it does little work a call), the sandbox without TurboFan (5 MB smaller than every tier, 5 MB larger than the interpreter, on which a warm command took twice the CPU), starts the gateway with optimization deferred until busy (9 MB smaller idle; the token path's CPU the same), and the runner and the memory service with every tier; lean: as auto, the runner and the memory service deferred too (2 to 9 MB smaller idle each), the sandbox on the interpreter; on: every tier in every service from the start",
      default: "auto",
      schema: oneOf("auto", "on", "lean"),
    },
    nodeOptions: {
      env: "NODE_OPTIONS",
      doc: "Node's own options, for every service process `troupe up` starts",
    },
  },
  gateway: {
    apiKeysFile: {
      env: "TROUPE_API_KEYS_FILE",
      flag: "api-keys",
      doc: "the keys file (troupe keys)",
      default: "<data-dir>/auth/api-keys.json",
    },
    apiKeysJson: { env: "TROUPE_API_KEYS", doc: "more keys, as the keys file's JSON" },
    tenantRate: { env: "TROUPE_TENANT_RATE", doc: "messages a second per tenant", default: 1000, schema: positive },
    tenantBurst: { env: "TROUPE_TENANT_BURST", doc: "burst per tenant", default: 2000, schema: positive },
    sessionRate: { env: "TROUPE_SESSION_RATE", doc: "messages a second per session", default: 20, schema: positive },
    sessionBurst: { env: "TROUPE_SESSION_BURST", doc: "burst per session", default: 200, schema: positive },
    tenantStreams: { env: "TROUPE_TENANT_STREAMS", doc: "open streams per tenant", default: 20_000, schema: positive },
    tlsCert: {
      env: "TROUPE_TLS_CERT",
      flag: "tls-cert",
      doc: "serve TLS with this certificate chain (PEM), read again every 5 s",
    },
    tlsKey: { env: "TROUPE_TLS_KEY", flag: "tls-key", doc: "the certificate's private key (PEM)", secret: true },
    httpAddr: {
      env: "TROUPE_HTTP_ADDR",
      flag: "http",
      doc: "HTTP address: the API as Connect (JSON) and gRPC-Web, and the OpenAI-compatible /v1; `off` turns it off",
      default: "127.0.0.1:8080",
    },
    httpCors: {
      env: "TROUPE_HTTP_CORS",
      doc: "origins browsers may call the HTTP API from, comma-separated (`*` for any)",
    },
    httpFirstByteMs: {
      env: "TROUPE_HTTP_FIRST_BYTE_MS",
      doc: "HTTP: a new connection's first byte (TLS: its whole handshake) must come within this, or it is closed",
      default: 5_000,
      schema: int(),
    },
    httpHeadMs: {
      env: "TROUPE_HTTP_HEAD_MS",
      doc: "HTTP: a request's head must be whole within this of its start (HTTP/2: a new session's first stream)",
      default: 10_000,
      schema: int(),
    },
    httpBodyMs: {
      env: "TROUPE_HTTP_BODY_MS",
      doc: "HTTP: a request's body must be whole within this of its head (408 otherwise); a streamed response is not cut",
      default: 30_000,
      schema: int(),
    },
    httpIdleMs: {
      env: "TROUPE_HTTP_IDLE_MS",
      doc: "HTTP: a kept-alive connection or HTTP/2 session with no request open is closed after this",
      default: 30_000,
      schema: int(),
    },
    httpMaxConnections: {
      env: "TROUPE_HTTP_MAX_CONNECTIONS",
      doc: "HTTP: open connections at most; more are refused at accept (logged, and counted in troupe.http.connections.refused)",
      default: 10_000,
      schema: int(),
    },
    channelReset: {
      env: "TROUPE_CHANNEL_RESET",
      doc: "what /new and /reset in a chat do to the old conversation: keep it in the history, or delete it",
      default: "keep",
      schema: oneOf("keep", "delete"),
    },
  },
  router: {
    routingFile: {
      env: "TROUPE_ROUTING_FILE",
      doc: "bindings, dm_scope, identity links (routing.json)",
      default: "<data-dir>/routing.json",
    },
    runnerLivenessMs: {
      env: "TROUPE_RUNNER_LIVENESS_MS",
      doc: "a runner silent this long is presumed dead",
      default: 10_000,
      schema: int(),
    },
  },
  runner: {
    runnerId: {
      env: "TROUPE_RUNNER_ID",
      flag: "runner-id",
      doc: "this runner's id, unique",
      default: "runner-<address>",
    },
    advertise: {
      env: "TROUPE_RUNNER_ADVERTISE",
      flag: "advertise",
      doc: "the address the gateway dials for this runner",
      default: "<runner address>",
    },
    openaiBaseUrl: { env: "OPENAI_BASE_URL", doc: "model endpoint", default: "<the scripted model server>" },
    openaiApiKey: { env: "OPENAI_API_KEY", doc: "model endpoint key", secret: true },
    openaiOrgId: { env: "OPENAI_ORG_ID", doc: "sent as OpenAI-Organization to that endpoint (a key in several)" },
    openaiProjectId: { env: "OPENAI_PROJECT_ID", doc: "sent as OpenAI-Project to that endpoint (a key in several)" },
    model: { env: "TROUPE_MODEL", doc: "the model of agents that name none", default: "scripted-1" },
    retentionSweepMs: {
      env: "TROUPE_RETENTION_SWEEP_MS",
      doc: "how often sessions past their agent's retentionDays are deleted",
      default: 3_600_000,
      schema: int(),
    },
    agentsDir: {
      env: "TROUPE_AGENTS_DIR",
      doc: "agent.json, workspace files, skills (docs/turn-pipeline.md)",
      default: "<data-dir>/agents",
    },
    passivateAfterMs: {
      env: "TROUPE_PASSIVATE_AFTER_MS",
      doc: "idle sessions leave memory after",
      default: 600_000,
      schema: int(),
    },
    minHeartbeatSeconds: {
      env: "TROUPE_MIN_HEARTBEAT_S",
      doc: "shortest heartbeat a schedule may ask for",
      default: 10,
      schema: int(),
    },
    hookModules: { env: "TROUPE_HOOKS", doc: "hook plugin modules, comma-separated" },
    netPorts: {
      env: "TROUPE_NET_PORTS",
      doc: "ports web_fetch and http_request may connect to, comma-separated",
      default: "80,443",
      schema: { type: "string", pattern: "^\\d{1,5}(,\\d{1,5})*$", message: "must be ports separated by commas" },
    },
    netAllow: {
      env: "TROUPE_NET_ALLOW",
      doc: "address ranges (CIDR, comma-separated) the SSRF guard treats as public",
    },
    secretsFile: {
      env: "TROUPE_SECRETS_FILE",
      doc: 'secrets http_request may send, as {"NAME": "value"}',
      default: "<data-dir>/secrets.json",
    },
    memoryContextK: {
      env: "TROUPE_MEMORY_CONTEXT_K",
      doc: "memories in a run's prompt (0: off)",
      default: 5,
      schema: int(0),
    },
    memoryLearn: {
      env: "TROUPE_MEMORY_LEARN",
      doc: "learning from each turn (0: off)",
      default: "1",
      schema: oneOf("0", "1"),
    },
    failpoints: { env: "TROUPE_FAILPOINTS", doc: "failpoints (tests only)" },
    ...Object.fromEntries(
      Object.entries(DEFAULT_QUOTAS).map(([k, d]) => [
        `quota.${k}`,
        { env: quotaEnv(k), doc: `quota: ${k} (docs/security.md, Quotas)`, default: d, schema: int() },
      ]),
    ),
  },
  memory: {
    memoryUri: { env: "TROUPE_MEMORY_URI", doc: "memory store (any LanceDB URI)", default: "<data-dir>/memory" },
    memoryMetadataCacheMb: {
      env: "TROUPE_MEMORY_METADATA_CACHE_MB",
      doc: "the cap on LanceDB's cache of table metadata, MB (LanceDB's own default, 1 GB, fills with every commit's)",
      default: 32,
      schema: int(),
    },
    memoryIndexCacheMb: {
      env: "TROUPE_MEMORY_INDEX_CACHE_MB",
      doc: "the cap on LanceDB's cache of index pages, MB (LanceDB's own default, 6 GB, is over the memory pod's limit)",
      default: 1024,
      schema: int(),
    },
    memoryReconnectCommits: {
      env: "TROUPE_MEMORY_RECONNECT_COMMITS",
      doc: "commits after which the memory database is opened anew, giving back what of LanceDB's native memory per commit goes with the connection (0: never)",
      default: 200,
      schema: int(0),
    },
    memoryStorageOptions: {
      env: "TROUPE_MEMORY_STORAGE_OPTIONS",
      doc: "its storage options (JSON object)",
      secret: true,
    },
    embeddingModel: {
      env: "TROUPE_EMBEDDING_MODEL",
      doc: "embedding model, as provider/model",
      default: "<built-in>",
    },
    embeddingDim: { env: "TROUPE_EMBEDDING_DIM", doc: "its vector size (needed with a model)", schema: int() },
    learningModel: {
      env: "TROUPE_LEARNING_MODEL",
      doc: "the model that picks what to remember, as provider/model",
      default: "<TROUPE_MODEL>",
    },
  },
  sandbox: {
    sandboxImage: { env: "TROUPE_SANDBOX_IMAGE", doc: "sandbox image", default: "troupe-sandbox:busybox" },
    sandboxImages: {
      env: "TROUPE_SANDBOX_IMAGES",
      doc: "other images agents may name for their sandboxes (agent.json workspace.image), comma-separated; each must hold troupe-agent (docs/sandbox.md, templates)",
    },
    sandboxRuntime: {
      env: "TROUPE_SANDBOX_RUNTIME",
      doc: "container runtime",
      default: "runc",
      schema: oneOf("runc", "runsc"),
    },
    sandboxScope: {
      env: "TROUPE_SANDBOX_SCOPE",
      doc: "who shares a sandbox",
      default: "session",
      schema: oneOf("session", "agent", "shared"),
    },
    execTimeoutMs: { env: "TROUPE_EXEC_TIMEOUT_MS", doc: "exec timeout", default: 60_000, schema: int() },
    sandboxIdleMs: {
      env: "TROUPE_SANDBOX_IDLE_MS",
      doc: "an unused sandbox is removed after",
      default: 1_800_000,
      schema: int(),
    },
    sandboxMaxAgeMs: {
      env: "TROUPE_SANDBOX_MAX_AGE_MS",
      doc: "no sandbox lives longer than",
      default: 86_400_000,
      schema: int(),
    },
    sandboxPoolSize: { env: "TROUPE_SANDBOX_POOL", doc: "warm sandboxes (0: none)", default: 2, schema: int(0) },
    sandboxWorkspaces: {
      env: "TROUPE_SANDBOX_WORKSPACES",
      doc: "kept: a sandbox's /workspace is saved in the data directory after work and restored into its key's next sandbox (after an idle reap, the maximum age, a crash); discarded: it goes with its container",
      default: "kept",
      schema: oneOf("kept", "discarded"),
    },
    sandboxSnapshots: {
      env: "TROUPE_SANDBOX_SNAPSHOTS",
      doc: "where workspace snapshots are kept: a directory (default <data-dir>/snapshots) or s3://bucket[/prefix][?region=R&endpoint=URL&path-style=true|false] on S3 or S3-compatible storage, with the AWS SDK's credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, web identity, instance roles; docs/sandbox.md, snapshots)",
    },
    dockerHost: {
      env: "DOCKER_HOST",
      doc: "the Docker engine: unix:///path, tcp://host:port (TLS with DOCKER_TLS_VERIFY, certificates in DOCKER_CERT_PATH), https://host:port or ssh://[user@]host[:port]; unset: the docker context, else the system socket, else the rootless one",
    },
    dockerTlsVerify: { env: "DOCKER_TLS_VERIFY", doc: "TLS to a tcp:// engine (any value but 0), as the docker CLI" },
    dockerCertPath: {
      env: "DOCKER_CERT_PATH",
      doc: "with DOCKER_TLS_VERIFY: the directory of ca.pem, cert.pem and key.pem (default: the docker config directory)",
    },
    dockerContext: {
      env: "DOCKER_CONTEXT",
      doc: "with DOCKER_HOST unset: the docker context whose engine is used (default: the config's currentContext)",
    },
    dockerConfigDir: {
      env: "DOCKER_CONFIG",
      doc: "the docker CLI's config directory, where contexts are (default ~/.docker)",
    },
    sshAuthSock: {
      env: "SSH_AUTH_SOCK",
      doc: "the SSH agent an ssh:// engine is reached with (else ~/.ssh/id_ed25519, id_ecdsa or id_rsa; the host must be in ~/.ssh/known_hosts)",
    },
    runtimeDir: {
      env: "XDG_RUNTIME_DIR",
      doc: "where a rootless Docker engine's socket (docker.sock) is looked for when nothing else names an engine",
    },
  },
  tracing: TELEMETRY_SETTINGS,
  clients: CLIENT_SETTINGS,
  "channel adapters": ADAPTER_SETTINGS,
} as const satisfies Record<string, Record<string, Setting>>;

export type SettingName = { [S in keyof typeof SETTINGS]: keyof (typeof SETTINGS)[S] }[keyof typeof SETTINGS];

/** Every setting by name, in section order. */
export const ALL_SETTINGS: [string, Setting][] = Object.values(SETTINGS).flatMap((section) => Object.entries(section));

/** docs/settings.md's table, section by section (a unit test keeps it in step). */
export function settingsTable(): string {
  const rows = ["| variable | flag | default | sets |", "|---|---|---|---|"];
  for (const [section, settings] of Object.entries(SETTINGS)) {
    rows.push(`| **${section}** | | | |`);
    for (const s of Object.values(settings) as Setting[]) {
      const dflt = s.default === undefined ? "" : `\`${s.default}\``;
      const name = s.lowerCase ? `\`${s.env}\` (\`${s.env.toLowerCase()}\` first)` : `\`${s.env}\``;
      rows.push(`| ${name} | ${s.flag ? `\`--${s.flag}\`` : ""} | ${dflt} | ${s.doc} |`);
    }
  }
  return `${rows.join("\n")}\n`;
}
