// Troupe's configuration: the one module that reads the environment. settings.ts declares
// every setting once, in a section per service: a flag if it has one, its variable, its default
// and its type, checked by setting-kinds.ts. The same names work for `troupe up` and for one service at a
// time. A TROUPE_* variable SETTINGS does not declare is reported at start (a typo must not be
// silently ignored); `troupe config` prints the values in force, secrets masked; docs/settings.md's
// table is settings.ts's settingsTable().
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import os from "node:os";
import path from "node:path";
import { isCidr } from "../net/address-ranges.js";
import { ALL_SETTINGS, SETTINGS, type Setting, type SettingName } from "./settings.js";
import { settingsChecker } from "./setting-kinds.js";
import { DEFAULT_QUOTAS, type Quotas } from "../auth/quotas.js";
import type { Addresses, Config, LimitsConfig, LogLevel } from "./config-types.js";

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

const ALL = ALL_SETTINGS;

/** Every environment variable Troupe reads. */
export const ENVIRONMENT: readonly Setting[] = ALL.map(([, s]) => s);

const checkSettings = settingsChecker(ALL);

/** TROUPE_* variables set but not read: typos, or settings of another version. */
export function unknownVariables(env: NodeJS.ProcessEnv = process.env): string[] {
  const known = new Set(ENVIRONMENT.map((e) => e.env));
  return Object.keys(env).filter((k) => k.startsWith("TROUPE_") && !known.has(k) && !k.startsWith("TROUPE_TEST_"));
}

/** The variable a setting is read from: its lower-case name when that is set (and non-empty), else its own. */
const variableOf = (s: Setting, env: NodeJS.ProcessEnv): string =>
  s.lowerCase && env[s.env.toLowerCase()] ? s.env.toLowerCase() : s.env;

/** The variables Troupe reads, as `troupe config` shows them: the value set (secrets masked), what it sets. */
export function effectiveEnvironment(
  env: NodeJS.ProcessEnv = process.env,
): { name: string; value: string; doc: string }[] {
  return ENVIRONMENT.map((e) => {
    const v = env[variableOf(e, env)];
    const value = v === undefined ? "(unset)" : e.secret ? (v === "" ? "" : "****") : v;
    return { name: e.env, value, doc: e.doc };
  });
}

/** The environment handed to the processes a supervisor starts (troupe up): this one's. */
export const childEnvironment = (): NodeJS.ProcessEnv => process.env;

/**
 * Session logs fsync on every acknowledgement; with libuv's default of 4 threads, a burst of new
 * sessions queues behind a handful of disk syncs. Call before the thread pool first starts.
 */
export function widenThreadPool(): void {
  process.env.UV_THREADPOOL_SIZE ??= String(SETTINGS["every service"].threadPool.default);
}

export const FLAG_OPTIONS = Object.fromEntries(
  ALL.filter(([, s]) => s.flag).map(([, s]) => [s.flag!, { type: "string" as const }]),
);

/** The telemetry part of Config from the OTEL_* settings. */
function telemetrySettings(str: (name: SettingName) => string | undefined): Pick<Config, "metricsToOtlp" | "otel"> {
  const disabled = str("otelSdkDisabled") === "true";
  const endpoint = Boolean(str("otelEndpoint"));
  const exporter = str("otelTracesExporter") ?? "otlp";
  const tracing =
    !disabled && exporter !== "none" && (exporter !== "otlp" || endpoint || Boolean(str("otelTracesEndpoint")));
  return {
    metricsToOtlp: !disabled && endpoint && str("otelMetricsExporter") !== "none",
    otel: {
      tracing,
      serviceName: str("otelServiceName") ?? "",
      protocol: (str("otelProtocol") ?? "http/protobuf") as Config["otel"]["protocol"],
    },
  };
}

/** TROUPE_MEMORY_STORAGE_OPTIONS: a JSON object of strings. */
function storageOptions(value: string | undefined): Record<string, string> {
  if (!value) return {};
  let doc: unknown;
  try {
    doc = JSON.parse(value);
  } catch (err) {
    throw new Error(`TROUPE_MEMORY_STORAGE_OPTIONS must be a JSON object: ${(err as Error).message}`);
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc))
    throw new Error("TROUPE_MEMORY_STORAGE_OPTIONS must be a JSON object of strings");
  return doc as Record<string, string>;
}

/**
 * The settings in force: each from its flag, else its variable (empty counts as unset), else its
 * default; every bad value is reported at once, named as it was given (flag or variable).
 */
/** The items of a comma-separated setting, trimmed, empty ones dropped. */
function commaList(text: unknown): string[] {
  return String(text ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
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
  const flags = values as Record<string, string | undefined>;
  const raw: Record<string, unknown> = {};
  const givenAs = new Map<string, string>();
  for (const [name, s] of ALL) {
    const fromFlag = s.flag ? flags[s.flag] : undefined;
    const envName = variableOf(s, env);
    const value = fromFlag ?? (env[envName] === "" ? undefined : env[envName]);
    if (value !== undefined) {
      raw[name] = value;
      givenAs.set(name, fromFlag !== undefined ? `--${s.flag}` : envName);
    } else if (s.default !== undefined && !String(s.default).includes("<")) raw[name] = s.default;
  }
  const problems = checkSettings(raw).map((p) => {
    const name = p.split(" ")[0];
    return `${givenAs.get(name) ?? name}${p.slice(name.length)}`;
  });
  if (raw.embeddingModel !== undefined && raw.embeddingDim === undefined)
    problems.push("TROUPE_EMBEDDING_DIM is needed with TROUPE_EMBEDDING_MODEL: the model's vector size");
  if ((raw.tlsCert === undefined) !== (raw.tlsKey === undefined))
    problems.push("TROUPE_TLS_CERT and TROUPE_TLS_KEY go together: TLS needs the certificate and its key");
  for (const cidr of commaList(raw.netAllow))
    if (!isCidr(cidr)) problems.push(`TROUPE_NET_ALLOW: ${cidr} is not a CIDR range (like 10.1.2.0/24)`);
  for (const port of commaList(raw.netPorts))
    if (Number(port) < 1 || Number(port) > 65535) problems.push(`TROUPE_NET_PORTS: ${port} is not a port (1-65535)`);
  if (problems.length > 0) throw new Error(problems.join("; "));
  const v = raw as Record<SettingName, string> & Record<SettingName, number>;
  const str = (name: SettingName) => v[name] as string | undefined;
  const dataDir = path.resolve(str("dataDir")!);
  const under = (name: SettingName, ...rel: string[]) => path.resolve(str(name) ?? path.join(dataDir, ...rel));
  const addr: Addresses = {
    gateway: str("gateway")!,
    router: str("router")!,
    runner: str("runner")!,
    memory: str("memory")!,
    sandbox: str("sandbox")!,
    model: str("modelServer")!,
  };
  return {
    addr,
    dataDir,
    routingFile: under("routingFile", "routing.json"),
    quotasFile: under("quotasFile", "quotas.json"),
    apiKeysFile: under("apiKeysFile", "auth", "api-keys.json"),
    // Both or neither (checked above).
    tls: str("tlsCert")
      ? { certFile: path.resolve(str("tlsCert")!), keyFile: path.resolve(str("tlsKey")!) }
      : undefined,
    tlsCa: str("tlsCa") ? path.resolve(str("tlsCa")!) : "",
    internalCa: str("internalCa") ? path.resolve(str("internalCa")!) : "",
    maxMessageBytes: v.maxMessageBytes,
    drainGraceMs: v.drainGraceMs,
    idleTrimMs: v.idleTrimMs,
    runnerId: str("runnerId") ?? `runner-${addr.runner}`,
    advertise: str("advertise") ?? addr.runner,
    openaiBaseUrl: str("openaiBaseUrl") ?? "",
    openaiApiKey: str("openaiApiKey") ?? "",
    openaiAccount: { organization: str("openaiOrgId") || undefined, project: str("openaiProjectId") || undefined },
    storeUrl: str("storeUrl") ?? "",
    providersFile: str("providersFile") ?? "",
    model: str("model")!,
    runnerLivenessMs: v.runnerLivenessMs,
    passivateAfterMs: v.passivateAfterMs,
    retentionSweepMs: v.retentionSweepMs,
    agentsDir: under("agentsDir", "agents"),
    minHeartbeatSeconds: v.minHeartbeatSeconds,
    net: { ports: commaList(str("netPorts")).map(Number), allow: commaList(str("netAllow")) },
    httpAddr: str("httpAddr") === "off" ? "" : str("httpAddr")!,
    httpCors: commaList(str("httpCors")),
    httpConnections: {
      firstByteMs: v.httpFirstByteMs,
      headMs: v.httpHeadMs,
      bodyMs: v.httpBodyMs,
      idleMs: v.httpIdleMs,
      maxConnections: v.httpMaxConnections,
    },
    channelReset: str("channelReset") as Config["channelReset"],
    secretsFile: under("secretsFile", "secrets.json"),
    hookModules: commaList(str("hookModules")).map((s) => path.resolve(s)),
    memoryContextK: v.memoryContextK,
    execTimeoutMs: v.execTimeoutMs,
    sandboxImage: str("sandboxImage")!,
    sandboxImages: commaList(str("sandboxImages")),
    sandboxSnapshots: str("sandboxSnapshots") ?? "",
    sandboxRuntime: str("sandboxRuntime")!,
    sandboxIdleMs: v.sandboxIdleMs,
    sandboxMaxAgeMs: v.sandboxMaxAgeMs,
    sandboxPoolSize: v.sandboxPoolSize,
    sandboxWorkspaces: str("sandboxWorkspaces") as Config["sandboxWorkspaces"],
    sandboxScope: str("sandboxScope") as Config["sandboxScope"],
    quotaDefaults: Object.fromEntries(
      Object.keys(DEFAULT_QUOTAS).map((k) => [k, raw[`quota.${k}`] as number]),
    ) as unknown as Quotas,
    limits: {
      tenantRate: v.tenantRate,
      tenantBurst: v.tenantBurst,
      sessionRate: v.sessionRate,
      sessionBurst: v.sessionBurst,
      tenantStreams: v.tenantStreams,
    },
    apiKeysJson: str("apiKeysJson") ?? "",
    clientApiKey: str("clientApiKey") ?? "",
    internalToken: str("internalToken") ?? "",
    logLevel: str("logLevel") as LogLevel,
    logFormat: str("logFormat") as Config["logFormat"],
    allocator: str("allocator") as Config["allocator"],
    jit: str("jit") as Config["jit"],
    adapter: {
      stateFile: str("adapterState") ? path.resolve(str("adapterState")!) : "",
      webhookAddr: str("webhookAddr")!,
      webhookSecret: str("webhookSecret") ?? "",
      webhookReplyUrl: str("webhookReplyUrl") ?? "",
      telegramBotToken: str("telegramBotToken") ?? "",
      telegramApiUrl: str("telegramApiUrl")!,
      telegramWebhookUrl: str("telegramWebhookUrl") ?? "",
      telegramWebhookSecret: str("telegramWebhookSecret") ?? "",
      slackBotToken: str("slackBotToken") ?? "",
      slackSigningSecret: str("slackSigningSecret") ?? "",
      slackAppToken: str("slackAppToken") ?? "",
      slackApiUrl: str("slackApiUrl")!,
      commandUsers: commaList(str("commandUsers")),
      dmPolicy: str("dmPolicy") as Config["adapter"]["dmPolicy"],
      allowFrom: commaList(str("allowFrom")),
      draftIntervalMs: v.draftIntervalMs,
      slackSocketRefreshMs: v.slackSocketRefreshMs,
    },
    failpoints: str("failpoints") ?? "",
    memoryLearn: str("memoryLearn") !== "0",
    memoryUri: str("memoryUri") ?? path.join(dataDir, "memory"),
    memoryStorageOptions: storageOptions(str("memoryStorageOptions")),
    memoryMetadataCacheMb: v.memoryMetadataCacheMb,
    memoryIndexCacheMb: v.memoryIndexCacheMb,
    memoryReconnectCommits: v.memoryReconnectCommits,
    embeddingModel: str("embeddingModel") ?? "",
    embeddingDim: str("embeddingModel") ? v.embeddingDim : 0,
    learningModel: str("learningModel") ?? "",
    scriptedTokenRate: v.scriptedTokenRate ?? 0,
    dockerHost: str("dockerHost") ?? "",
    dockerTlsVerify: Boolean(str("dockerTlsVerify")) && str("dockerTlsVerify") !== "0",
    dockerCertPath: str("dockerCertPath") || str("dockerConfigDir") || path.join(os.homedir(), ".docker"),
    dockerContext: str("dockerContext") ?? "",
    dockerConfigDir: str("dockerConfigDir") || path.join(os.homedir(), ".docker"),
    runtimeDir: str("runtimeDir") ?? "",
    sshAuthSock: str("sshAuthSock") ?? "",
    homeDir: os.homedir(),
    metricsAddr: str("metricsAddr") === "off" ? "" : (str("metricsAddr") ?? ""),
    outboundProxy:
      str("httpsProxy") || str("httpProxy")
        ? {
            httpsProxy: withScheme(str("httpsProxy")),
            httpProxy: withScheme(str("httpProxy")),
            noProxy: str("noProxy"),
          }
        : undefined,
    ...telemetrySettings(str),
    rest: positionals,
    flags: values as Record<string, string | boolean | string[] | undefined>,
  };
}

/** A proxy URL given without a scheme is an http:// one. */
const withScheme = (url: string | undefined) => (url && !/^https?:\/\//.test(url) ? `http://${url}` : url);

/** The base URL the runner's model client uses: the configured endpoint, else the scripted server. */
export const modelBaseUrl = (c: Config): string => c.openaiBaseUrl || `http://${c.addr.model}/v1`;

/**
 * A secret named by a file the operator wrote (a provider's key): the variable's value or the
 * file's first line. Throws, naming the variable or file but never the value, when it is missing.
 */
export function secretFrom(ref: { env?: string; file?: string }, env: NodeJS.ProcessEnv = process.env): string {
  if (ref.env !== undefined) {
    const v = env[ref.env];
    if (!v) throw new Error(`the variable ${ref.env} is not set`);
    return v;
  }
  let text: string;
  try {
    text = readFileSync(ref.file ?? "", "utf8");
  } catch (err) {
    throw new Error(`cannot read ${ref.file} (${(err as NodeJS.ErrnoException).code ?? err})`);
  }
  const key = text.split(/\r?\n/)[0].trim();
  if (!key) throw new Error(`${ref.file} is empty`);
  return key;
}
