// `troupe status` and `troupe doctor`: is everything a deployment needs there, and answering?
// Each service's health, the HTTP address, the model endpoint, the configured models as their
// providers describe them (an announced end of life, or not served), Docker and gVisor, the
// sandbox image, the keys file and the data directory. The exit code is 0 only when every required
// check passes (the models check only warns); `doctor` prints what to do about each that does not.
import { access, constants, readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { ProviderModels } from "../runner/providers/provider-models.js";
import { Engine, engineAddress } from "../sandbox/engine.js";
import { loadConfig, modelBaseUrl } from "../shared/config/config.js";
import { alwaysDirect, proxyHosts, useOutboundProxy } from "../shared/net/outbound-proxy.js";
import { loadProviders, resolveModel, singleProvider } from "../shared/models/providers.js";
import type { Config } from "../shared/config/config-types.js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../shared/gen/grpc/health/v1/health_pb.js";
import { createClient } from "../shared/rpc.js";
import { CLIENT_FLAGS } from "./gateway-client.js";

interface Check {
  name: string;
  ok: boolean;
  detail: string;
  fix?: string;
  /** Reported, but not counted against the exit code. */
  optional?: boolean;
}

const SERVICES = ["gateway", "router", "runner", "memory", "sandbox"] as const;

async function serviceCheck(cfg: Config, name: (typeof SERVICES)[number], tls?: { ca?: Buffer }): Promise<Check> {
  const address = cfg.addr[name];
  // The gateway as its clients reach it; the others as Troupe's services do (internal TLS or not).
  const internal = cfg.internalCa ? { ca: await readFile(cfg.internalCa) } : undefined;
  const health = createClient(Health, address, { tls: name === "gateway" ? tls : internal });
  try {
    // A new connection and its first call: on a loaded machine (a test run, a busy host) 1.5 s
    // was too little and a serving service was reported down.
    const { status } = await health.check({ service: "" }, { timeoutMs: 5000 });
    const serving = status === Serving.SERVING;
    return {
      name,
      ok: serving,
      detail: `${address} ${serving ? "serving" : Serving[status].toLowerCase().replace("_", " ")}`,
      fix:
        name === "sandbox"
          ? "the sandbox service cannot reach the Docker engine: see docker below"
          : `it is draining or starting; wait, or restart it (troupe serve ${name})`,
    };
  } catch (err) {
    return {
      name,
      ok: false,
      detail: `${address} unreachable (${/\bE[A-Z]{3,}\b/.exec(String((err as { details?: string }).details ?? err))?.[0] ?? "no answer within 1.5 s"})`,
      fix: `start Troupe with \`make run\` or \`troupe up\` (or this one: troupe serve ${name}); or point --${name} at where it runs`,
    };
  }
}

async function httpCheck(cfg: Config): Promise<Check> {
  if (!cfg.httpAddr) return { name: "http", ok: true, detail: "off (TROUPE_HTTP_ADDR=off)", optional: true };
  const url = `${cfg.tls ? "https" : "http"}://${cfg.httpAddr}/healthz`;
  const ok = await fetch(url, { signal: AbortSignal.timeout(1500) }).then(
    (r) => r.ok,
    () => false,
  );
  return {
    name: "http",
    ok,
    detail: `${cfg.httpAddr} ${ok ? "serving" : "unreachable"}`,
    fix: "the gateway serves it: start the gateway, or set TROUPE_HTTP_ADDR to where it listens",
  };
}

async function modelCheck(cfg: Config): Promise<Check> {
  if (cfg.providersFile) {
    const ok = await readFile(cfg.providersFile, "utf8").then(
      (t) => (JSON.parse(t), true),
      () => false,
    );
    return {
      name: "model",
      ok,
      detail: `providers file ${cfg.providersFile}${ok ? "" : " unreadable or not JSON"}`,
      fix: "check it with `troupe config validate FILE --kind providers`",
    };
  }
  const base = modelBaseUrl(cfg);
  const res = await fetch(`${base}/models`, {
    headers: cfg.openaiApiKey ? { authorization: `Bearer ${cfg.openaiApiKey}` } : {},
    signal: AbortSignal.timeout(3000),
  }).then(
    (r) => `HTTP ${r.status}`,
    (e: Error) => `unreachable (${e.cause ? String((e.cause as Error).message ?? e.cause) : e.message})`,
  );
  // Named where the check went through it (NO_PROXY may still exempt the endpoint; the fix says so).
  const proxy = cfg.outboundProxy && !alwaysDirect(base) ? `; outbound proxy ${proxyHosts(cfg.outboundProxy)}` : "";
  return {
    name: "model",
    ok: res === "HTTP 200",
    detail: `${base} ${res}${cfg.openaiBaseUrl ? `, model ${cfg.model}` : " (the scripted model)"}${proxy}`,
    fix: cfg.openaiBaseUrl
      ? `check OPENAI_BASE_URL and OPENAI_API_KEY (401: the key; 404: the base URL should end in /v1)${proxy ? ", and HTTPS_PROXY, HTTP_PROXY and NO_PROXY" : ""}`
      : "the scripted model server runs under `troupe up`; or set OPENAI_BASE_URL, OPENAI_API_KEY and TROUPE_MODEL",
  };
}

/** Where each model is configured: TROUPE_MODEL, the learning model, and every agent.json's chain. */
async function configuredModels(cfg: Config): Promise<Map<string, string[]>> {
  const named = new Map<string, string[]>();
  const add = (model: unknown, where: string) => {
    if (typeof model === "string" && model !== "") named.set(model, [...(named.get(model) ?? []), where]);
  };
  add(cfg.model, "TROUPE_MODEL");
  add(cfg.learningModel, "TROUPE_LEARNING_MODEL");
  const entries = await readdir(cfg.agentsDir, { withFileTypes: true }).catch(() => []);
  for (const e of entries.sort((a, b) => (a.name < b.name ? -1 : 1))) {
    if (!e.isDirectory()) continue;
    const agent = await readFile(path.join(cfg.agentsDir, e.name, "agent.json"), "utf8").then(
      (t) => JSON.parse(t) as { model?: unknown; fallbacks?: unknown; models?: unknown },
      () => undefined,
    );
    if (!agent) continue;
    const chain = [agent.model, agent.fallbacks, agent.models].flat();
    for (const model of chain) add(model, `agent ${e.name}`);
  }
  return named;
}

/** How long doctor waits for each provider to describe a model. */
const DESCRIBE_TIMEOUT_MS = 5000;

/**
 * Configured models as their providers describe them (shared/models/model-lifecycle.ts): those with an
 * announced end of life, and those a provider answers 404 for (a typo, or a model already retired).
 * A warning only: an agent's fallbacks may cover one, and a provider that cannot be asked says
 * nothing either way.
 */
async function modelsCheck(cfg: Config): Promise<Check> {
  const check = {
    name: "models",
    optional: true,
    fix: "move them to a later model, or correct the name (agent.json's model, fallbacks and models; TROUPE_MODEL)",
  };
  let providers: ReturnType<typeof loadProviders>;
  try {
    providers = cfg.providersFile
      ? loadProviders(cfg.providersFile)
      : singleProvider(modelBaseUrl(cfg), cfg.openaiApiKey, cfg.openaiAccount);
  } catch {
    return { ...check, ok: true, detail: "not checked: the providers file does not load (see model above)" };
  }
  const named = [...(await configuredModels(cfg))].filter(([model]) => resolveModel(providers, model));
  const models = new ProviderModels(providers);
  const signal = AbortSignal.timeout(DESCRIBE_TIMEOUT_MS);
  const described = await Promise.all(named.map(([model]) => models.lifecycle(model, signal)));
  await models.close();
  const ending: string[] = [];
  const unserved: string[] = [];
  described.forEach(({ served, endOfLife }, i) => {
    const [model, where] = named[i];
    if (endOfLife) ending.push(`${model} on ${endOfLife} (${where.join(", ")})`);
    else if (served === false) unserved.push(`${model} (${where.join(", ")})`);
  });
  const problems = [
    ...(ending.length > 0 ? [`end of life announced for ${ending.join("; ")}`] : []),
    ...(unserved.length > 0 ? [`not served by their provider (HTTP 404): ${unserved.join("; ")}`] : []),
  ];
  return problems.length > 0
    ? { ...check, ok: false, detail: problems.join("; and ") }
    : { ...check, ok: true, detail: `${named.length} configured, none with an announced end of life` };
}

async function dockerChecks(cfg: Config): Promise<Check[]> {
  let docker: Engine;
  try {
    docker = new Engine(engineAddress(cfg));
  } catch (err) {
    return [
      {
        name: "docker",
        ok: false,
        detail: (err as Error).message,
        fix: "set DOCKER_HOST to unix:///path, tcp://host:port or ssh://host, or choose a docker context",
      },
    ];
  }
  try {
    return await engineChecks(cfg, docker);
  } finally {
    docker.close();
  }
}

async function engineChecks(cfg: Config, docker: Engine): Promise<Check[]> {
  const info = await docker.info().catch(() => undefined);
  if (!info)
    return [
      {
        name: "docker",
        ok: false,
        detail: `no engine at ${docker.name}`,
        fix: "start dockerd (`make host` installs and starts it), or set DOCKER_HOST",
      },
    ];
  const runtimes = Object.keys(info.Runtimes ?? {});
  const image = await docker.inspectImage(cfg.sandboxImage).then(
    () => true,
    () => false,
  );
  return [
    { name: "docker", ok: true, detail: `engine up; runtimes ${runtimes.join(", ")}` },
    {
      name: "runsc",
      ok: runtimes.includes("runsc"),
      optional: cfg.sandboxRuntime !== "runsc",
      detail: runtimes.includes("runsc") ? "gVisor registered" : "gVisor is not registered with the engine",
      fix: "`make host` installs runsc and registers it",
    },
    {
      name: "image",
      ok: image,
      detail: `${cfg.sandboxImage} ${image ? "present" : "missing"} (runtime ${cfg.sandboxRuntime})`,
      fix: "build it: make sandbox-image",
    },
  ];
}

async function filesChecks(cfg: Config): Promise<Check[]> {
  const keys = await readFile(cfg.apiKeysFile, "utf8").then(
    (t) => ((JSON.parse(t) as { keys?: unknown[] }).keys ?? []).length,
    (e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? "missing" : "unreadable or not JSON"),
  );
  const writable = await access(cfg.dataDir, constants.W_OK).then(
    () => true,
    () => false,
  );
  return [
    {
      name: "keys",
      ok: typeof keys === "number" && keys > 0,
      detail: `${cfg.apiKeysFile}: ${typeof keys === "number" ? `${keys} key${keys === 1 ? "" : "s"}` : keys}`,
      fix: "`troupe up` makes a development key; `troupe keys create --tenant T --principal P` makes others",
    },
    {
      name: "data",
      ok: writable,
      detail: `${cfg.dataDir} ${writable ? "writable" : "missing or not writable"}`,
      fix: "create it, or give the user Troupe runs as write access (or set TROUPE_DATA_DIR)",
    },
  ];
}

export async function statusCommand(args: string[], doctor: boolean): Promise<number> {
  const cfg = loadConfig(args, undefined, { ...CLIENT_FLAGS });
  useOutboundProxy(cfg.outboundProxy);
  const tls =
    cfg.flags.tls === true || cfg.tlsCa !== "" ? { ca: cfg.tlsCa ? await readFile(cfg.tlsCa) : undefined } : undefined;
  const checks = [
    ...(await Promise.all(SERVICES.map((s) => serviceCheck(cfg, s, tls)))),
    await httpCheck(cfg),
    await modelCheck(cfg),
    await modelsCheck(cfg),
    ...(await dockerChecks(cfg)),
    ...(await filesChecks(cfg)),
  ];
  for (const c of checks) {
    process.stdout.write(`${(c.ok ? "ok" : c.optional ? "warn" : "FAIL").padEnd(5)} ${c.name.padEnd(8)} ${c.detail}\n`);
    if (doctor && !c.ok && c.fix) process.stdout.write(`${" ".repeat(15)}fix: ${c.fix}\n`);
  }
  const failed = checks.filter((c) => !c.ok && !c.optional);
  if (failed.length > 0 && !doctor) process.stdout.write("(troupe doctor says how to fix each)\n");
  return failed.length === 0 ? 0 : 1;
}
