// Starts Troupe's real processes for a test: the scripted model server and the five services, each
// `node dist/services/cli/main.js <name>` on its own free loopback port, with a fresh data dir.
import { UNEXPECTED } from "../../services/runner/session/lifecycle.js";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import https from "node:https";
import { promisify } from "node:util";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import {
  Health,
  HealthCheckResponse_ServingStatus as Serving,
} from "../../services/shared/gen/grpc/health/v1/health_pb.js";
import { GatewayService } from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import { RouterService } from "../../services/shared/gen/troupe/v1/router_pb.js";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { createApiKey, type Role } from "../../services/shared/auth/api-keys.js";
import { ensureDevKey, identityHeaders, internalCredentials, type Identity } from "../../services/shared/auth/auth.js";
import { Status } from "../../services/shared/errors.js";
import { createClient, type ClientOptions, type ServiceClient } from "../../services/shared/rpc.js";
import { instanceOf } from "../../services/sandbox/container-spec.js";
import { SERVICE_TYPE } from "../../services/cli/up/command.js";
import { freePort } from "../../services/cli/free-port.js";

export { SERVICE_TYPE };

/**
 * Quotas out of the way, for load tests and benchmarks that play thousands of users as one
 * tenant (a real deployment spreads them over tenants, each under its quotas).
 */
export const LOAD_QUOTAS = {
  TROUPE_QUOTA_CONCURRENT_RUNS: "1000000",
  TROUPE_QUOTA_SESSIONS_PER_MINUTE: "1000000",
  TROUPE_QUOTA_LIVE_SANDBOXES: "100000",
  TROUPE_QUOTA_ABORTS_PER_SECOND: "1000000",
};

const run = promisify(execFile);
export const MAIN = fileURLToPath(new URL("../../services/cli/main.js", import.meta.url));

/**
 * `troupe chat ARGS` against the stack's gateway, as a user runs it. Rejects on a non-zero exit
 * with an error carrying `code`, `stdout` and `stderr`.
 */
export function troupeChat(
  stack: { dataDir: string; addr: { gateway: string } },
  args: string[],
  options: { env?: NodeJS.ProcessEnv; timeout?: number } = {},
): Promise<{ stdout: string; stderr: string }> {
  const argv = [MAIN, "chat", "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway, ...args];
  return run(process.execPath, argv, { encoding: "utf8", ...options });
}

export { freePort };

export type ServiceName = "model-server" | "router" | "memory" | "sandbox" | "runner" | "gateway";
export const SERVICE_ORDER: ServiceName[] = ["model-server", "router", "memory", "sandbox", "runner", "gateway"];

/** Each service's gRPC address, and the gateway's HTTP one. */
export type StackAddresses = Record<ServiceName, string> & { http?: string };

export interface Stack {
  addr: StackAddresses & { http: string };
  dataDir: string;
  env: NodeJS.ProcessEnv;
  /** A gateway client authenticated with the stack's development key (tenant local, principal dev). */
  gateway: ServiceClient<(typeof GatewayService)["method"]>;
  /** The development API key, and the headers of Troupe's internal calls. */
  apiKey: string;
  internalHeaders: Record<string, string>;
  /**
   * A client that speaks as Troupe's own services do (internal token), optionally on behalf of a
   * client identity (the headers the gateway adds), for tests that call a service directly.
   */
  client<S extends GenServiceMethods>(
    service: GenService<S>,
    address: string,
    options?: ClientOptions & { as?: Identity },
  ): ServiceClient<S>;
  /** A gateway client authenticated as tenant/principal (a key made for it, accepted before this resolves). */
  gatewayAs(
    tenant: string,
    principal: string,
    options?: ClientOptions,
    key?: { role?: Role; channels?: string[] },
  ): Promise<ServiceClient<(typeof GatewayService)["method"]>>;
  /** A new API key of tenant/principal, accepted by the gateway before this resolves. */
  keyFor(tenant: string, principal: string, key?: { role?: Role; channels?: string[] }): Promise<string>;
  /** Everything the processes wrote to stderr, for failure messages. */
  logs(): string;
  start(name: ServiceName): Promise<void>;
  /**
   * Starts another process of a service under its own key (a second runner, say), on a fresh
   * port unless `addr` is given; `args` are extra flags. Returns its address.
   */
  startInstance(
    key: string,
    name: ServiceName,
    opts?: { addr?: string; args?: string[]; env?: NodeJS.ProcessEnv },
  ): Promise<string>;
  kill(key: string, signal?: NodeJS.Signals): Promise<number | null>;
  process(key: string): ChildProcess | undefined;
  stop(): Promise<void>;
}

export interface StackOptions {
  env?: NodeJS.ProcessEnv;
  services?: ServiceName[];
  dataDir?: string;
  /**
   * The scripted model server over HTTPS (h2 and http/1.1 offered, as hosted APIs are reached),
   * with this certificate and key; every process trusts `ca` and calls the model at https://.
   */
  modelServerTls?: { cert: string; key: string; ca: string };
}

/** Whether the model server at `addr` answers its health check (over HTTPS trusting `ca`, if given). */
async function modelServerUp(addr: string, ca?: Buffer): Promise<boolean> {
  if (!ca) return (await fetch(`http://${addr}/healthz`)).ok;
  return new Promise((resolve, reject) =>
    https
      .get(`https://${addr}/healthz`, { ca }, (res) => (res.resume(), resolve(res.statusCode === 200)))
      .on("error", reject),
  );
}

/** Writes agent `id`'s agent.json under `dataDir`, as an operator would before the stack starts. */
export async function writeAgent(dataDir: string, id: string, config: object): Promise<void> {
  await mkdir(path.join(dataDir, "agents", id), { recursive: true });
  await writeFile(path.join(dataDir, "agents", id, "agent.json"), JSON.stringify(config));
}

/** The flags that give a process the stack's addresses; no HTTP face unless addr.http is set. */
export function flagsFor(addr: StackAddresses, dataDir: string): string[] {
  return [
    "--http",
    addr.http ?? "off",
    "--data-dir",
    dataDir,
    "--gateway",
    addr.gateway,
    "--router",
    addr.router,
    "--runner",
    addr.runner,
    "--memory",
    addr.memory,
    "--sandbox",
    addr.sandbox,
    "--model-server",
    addr["model-server"],
  ];
}

export async function waitFor<T>(
  what: string,
  fn: () => Promise<T | undefined | false>,
  timeoutMs = 20_000,
  everyMs = 100,
): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  let lastErr: unknown;
  while (performance.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      lastErr = err;
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out waiting for ${what}${lastErr ? `: ${String(lastErr)}` : ""}`);
}

/**
 * Waits until `address` serves `service` (by default, anything). Naming the service matters: a
 * port answered by another process says NOT_FOUND for a service it does not have.
 */
export async function waitServing(
  address: string,
  timeoutMs = 20_000,
  service = "",
  tls?: { ca?: Buffer },
): Promise<void> {
  const health = createClient(Health, address, { tls });
  try {
    await waitFor(
      `${address} to serve ${service || "anything"}`,
      async () => (await health.check({ service }, { timeoutMs: 500 })).status === Serving.SERVING,
      timeoutMs,
    );
  } finally {
    health.close();
  }
}

/** A `troupe up` supervisor a test started (startUp). */
export interface Up {
  proc: ChildProcess;
  addr: StackAddresses;
  /** What it has printed (its last `keepChars` characters). */
  log(): string;
}

/**
 * Starts `troupe up <args>` over `dataDir` on fresh loopback ports (or `addr`), as an operator
 * would (no OPENAI_BASE_URL: the scripted model), and resolves once it says it is up.
 */
export async function startUp(
  dataDir: string,
  options: {
    args?: string[];
    /** Added to this process's environment; a name set to undefined is left out. */
    env?: NodeJS.ProcessEnv;
    addr?: StackAddresses;
    /** How `troupe` is named on the command line. */
    main?: string;
    keepChars?: number;
    timeoutMs?: number;
  } = {},
): Promise<Up> {
  const addr = options.addr ?? ({} as StackAddresses);
  if (!options.addr) for (const name of SERVICE_ORDER) addr[name] = `127.0.0.1:${await freePort()}`;
  const env: NodeJS.ProcessEnv = { ...process.env, ...options.env };
  delete env.OPENAI_BASE_URL;
  for (const [name, value] of Object.entries(options.env ?? {})) if (value === undefined) delete env[name];
  const proc = spawn(
    process.execPath,
    [options.main ?? MAIN, "up", ...(options.args ?? []), ...flagsFor(addr, dataDir)],
    {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let log = "";
  const keep = options.keepChars ?? Number.POSITIVE_INFINITY;
  const add = (d: Buffer) => {
    log += d;
    if (log.length > keep) log = log.slice(-keep);
  };
  proc.stdout!.on("data", add);
  proc.stderr!.on("data", add);
  try {
    await waitFor("troupe up to say it is up", async () => log.includes("Troupe is up"), options.timeoutMs ?? 60_000);
  } catch (err) {
    proc.kill("SIGKILL");
    throw new Error(`${(err as Error).message}; it printed:\n${log.slice(-4000)}`);
  }
  return { proc, addr, log: () => log };
}

/**
 * Stops a `troupe up` started by a test, if it still runs, as an operator would: SIGINT, then
 * waits for it to exit (SIGKILL after 30 s). A SIGKILL alone would leave its services and their
 * pooled containers running, for the next start on that data directory to reap.
 */
export async function stopUp(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  proc.kill("SIGINT");
  const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
  await exited;
  clearTimeout(timer);
}

/** Whether a process of this pid runs (a zombie, dead but not yet reaped by its parent, does not). */
export function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** The ids of the containers made for the stack of `dataDir`, running or not. */
export async function sandboxContainers(dataDir: string): Promise<string[]> {
  const { stdout } = await run("docker", ["ps", "-aq", "--filter", `label=troupe.instance=${instanceOf(dataDir)}`]);
  return stdout.split("\n").filter(Boolean);
}

/** Removes the containers a test stack's sandbox made (and only those). */
export async function removeSandboxes(dataDir: string): Promise<void> {
  const ids = await sandboxContainers(dataDir);
  if (ids.length > 0) await run("docker", ["rm", "-f", ...ids]);
}

export async function startStack(options: StackOptions = {}): Promise<Stack> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), "troupe-test-")));
  const addr = {} as Stack["addr"];
  for (const name of SERVICE_ORDER) addr[name] = `127.0.0.1:${await freePort()}`;
  addr.http = `127.0.0.1:${await freePort()}`;
  // Plain lines: the logs are read by tests and shown in their failure messages (JSON lines are
  // tested in test/logs.test.ts).
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    TROUPE_LOG_LEVEL: "info",
    TROUPE_LOG_FORMAT: "text",
    ...options.env,
  };
  delete env.OPENAI_BASE_URL;
  // Credentials come from the stack's own data directory, never from the caller's environment.
  for (const k of ["TROUPE_INTERNAL_TOKEN", "TROUPE_API_KEY", "TROUPE_API_KEYS", "TROUPE_API_KEYS_FILE"]) delete env[k];
  if (options.env?.OPENAI_BASE_URL) env.OPENAI_BASE_URL = options.env.OPENAI_BASE_URL;
  const modelTls = options.modelServerTls;
  if (modelTls) {
    env.OPENAI_BASE_URL = `https://${addr["model-server"]}/v1`;
    env.NODE_EXTRA_CA_CERTS = modelTls.ca;
  }
  const procs = new Map<string, ChildProcess>();
  let logText = "";
  // The credentials `troupe up` would make: every process of the stack reads them from dataDir.
  const internal = await internalCredentials(dataDir);
  const dev = await ensureDevKey(dataDir);

  /** Whether any sandbox process ran: its session containers outlive it by design (fleet.ts adopts them). */
  let ranSandbox = false;
  const spawnService = async (
    key: string,
    name: ServiceName,
    at: StackAddresses,
    args: string[] = [],
    extraEnv: NodeJS.ProcessEnv = {},
  ) => {
    if (name === "sandbox") ranSandbox = true;
    const proc = spawn(process.execPath, [MAIN, name, ...flagsFor(at, dataDir), ...args], {
      env: { ...env, ...extraEnv },
      stdio: ["ignore", "pipe", "pipe"],
    });
    proc.stdout!.on("data", (d) => (logText += d));
    proc.stderr!.on("data", (d) => {
      logText += d;
      if (env.TEST_STDERR) process.stderr.write(d);
    });
    procs.set(key, proc);
    if (name === "model-server") {
      const ca = modelTls ? await readFile(modelTls.ca) : undefined;
      await waitFor("the model server", () => modelServerUp(at[name], ca));
    } else {
      // A process that exits first (its port taken, a bad flag) fails the start at once, with its logs.
      const exited = new Promise<never>((_, reject) =>
        proc.once("exit", (code, signal) => reject(new Error(`${name} exited (${signal ?? code}) before serving`))),
      );
      exited.catch(() => undefined);
      // A gateway serving TLS is asked over TLS, trusting the CA the test put in its environment;
      // another service when TLS between services is on, trusting the internal CA.
      const all = { ...env, ...extraEnv };
      const ca = !all.TROUPE_TLS_CERT
        ? undefined
        : name === "gateway"
          ? (all.TROUPE_TLS_CA ?? all.TROUPE_INTERNAL_TLS_CA)
          : all.TROUPE_INTERNAL_TLS_CA;
      const tls = ca ? { ca: await readFile(ca) } : undefined;
      await Promise.race([waitServing(at[name], 20_000, SERVICE_TYPE[name], tls), exited]).catch((err) => {
        throw new Error(`${err.message}\n--- logs ---\n${logText}`);
      });
    }
  };
  const modelArgs = modelTls ? ["--https-cert", modelTls.cert, "--https-key", modelTls.key] : [];
  const start = (name: ServiceName) => spawnService(name, name, addr, name === "model-server" ? modelArgs : []);
  const startInstance = async (
    key: string,
    name: ServiceName,
    opts: { addr?: string; args?: string[]; env?: NodeJS.ProcessEnv } = {},
  ) => {
    const at: StackAddresses = { ...addr, [name]: opts.addr ?? `127.0.0.1:${await freePort()}` };
    // Another gateway serves HTTP on a port of its own (or none, for one restarted on the first's).
    if (name === "gateway") at.http = opts.addr === addr.gateway ? addr.http : undefined;
    await spawnService(key, name, at, opts.args, opts.env);
    return at[name];
  };

  const kill = async (key: string, signal: NodeJS.Signals = "SIGTERM") => {
    const proc = procs.get(key);
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return proc?.exitCode ?? null;
    const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
    // A stopped process would not act on SIGTERM.
    if (signal === "SIGTERM") proc.kill("SIGCONT");
    proc.kill(signal);
    const code = await exited;
    procs.delete(key);
    return code;
  };
  const services = options.services ?? SERVICE_ORDER;
  /** Every process of the stack stopped (extra instances first), its sandboxes and data directory removed. */
  const teardown = async () => {
    for (const key of procs.keys()) if (!(SERVICE_ORDER as string[]).includes(key)) await kill(key, "SIGTERM");
    for (const name of [...SERVICE_ORDER].reverse()) await kill(name, "SIGTERM");
    try {
      if (ranSandbox) await removeSandboxes(dataDir);
    } finally {
      if (!options.dataDir) await rm(dataDir, { recursive: true, force: true });
    }
  };

  try {
    for (const name of services) await start(name);
    if (services.includes("runner")) {
      const router = createClient(RouterService, addr.router, { headers: internal.headers });
      await waitFor("the runner to register", async () => (await router.listRunners({})).runners.length > 0);
      router.close();
    }
  } catch (err) {
    // Nobody holds a stack that failed to start, so nobody would stop what it started: the
    // services already running would keep the test process alive, and the run would hang
    // instead of failing. The start's error is the one worth reporting (with no Docker engine,
    // removing the sandboxes fails too).
    await teardown().catch(() => undefined);
    throw err;
  }
  const gateway = createClient(GatewayService, addr.gateway, { headers: { authorization: `Bearer ${dev.key}` } });
  const client = <S extends GenServiceMethods>(
    service: GenService<S>,
    address: string,
    opts: ClientOptions & { as?: Identity } = {},
  ) =>
    createClient(service, address, {
      ...opts,
      headers: { ...internal.headers, ...(opts.as ? identityHeaders(opts.as) : {}), ...opts.headers },
    });
  const keyFor = async (
    tenant: string,
    principal: string,
    spec: { role?: Role; channels?: string[] } = {},
    opts: ClientOptions = {},
  ) => {
    const id = `${tenant}-${principal}-${spec.role ?? "user"}-${Math.random().toString(36).slice(2, 8)}`;
    const key = await createApiKey(path.join(dataDir, "auth", "api-keys.json"), { tenant, principal, id, ...spec });
    const c = createClient(GatewayService, addr.gateway, {
      ...opts,
      headers: { authorization: `Bearer ${key}`, ...opts.headers },
    });
    // The gateway re-reads its keys file every 2 s.
    try {
      await waitFor(
        `the gateway to accept the key of ${tenant}/${principal}`,
        async () => {
          try {
            await c.listSessions({ pageSize: 1 }, { timeoutMs: 1000 });
            return true;
          } catch (err) {
            if ((err as { code?: number }).code === Status.UNAUTHENTICATED) return false;
            return true;
          }
        },
        10_000,
        200,
      );
    } finally {
      c.close();
    }
    return key;
  };
  const gatewayAs = async (
    tenant: string,
    principal: string,
    opts: ClientOptions = {},
    spec: { role?: Role; channels?: string[] } = {},
  ) => {
    const key = await keyFor(tenant, principal, spec, opts);
    return createClient(GatewayService, addr.gateway, {
      ...opts,
      headers: { authorization: `Bearer ${key}`, ...opts.headers },
    });
  };

  return {
    addr,
    dataDir,
    env,
    gateway,
    apiKey: dev.key,
    internalHeaders: internal.headers,
    client,
    gatewayAs,
    keyFor,
    logs: () => logText,
    start,
    startInstance,
    kill,
    process: (key) => procs.get(key),
    async stop() {
      gateway.close();
      await teardown();
      // A session that met a happening its lifecycle table does not expect is a bug, whatever the test asserted.
      const surprises = logText.split("\n").filter((line) => line.includes(UNEXPECTED));
      if (surprises.length > 0) throw new Error(`the runner logged:\n${surprises.slice(0, 10).join("\n")}`);
    },
  };
}
