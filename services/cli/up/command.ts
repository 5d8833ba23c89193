// `troupe up`: the whole stack as child processes of one supervisor. A child that dies is started
// again after a backoff; Ctrl-C (or SIGTERM) drains every child and exits when they are gone.
// `--runners N --gateways M --routers R` start a local cluster; `--store postgres` gives it a
// PostgreSQL server of its own in <data-dir>/postgres (unless TROUPE_STORE_URL names one). What
// runs where is written to <data-dir>/up.json.
import { spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { mkdir, readFile, rename, stat } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { authPaths, ensureDevKey, internalCredentials, internalToken } from "../../shared/auth/auth.js";
import { childEnvironment, loadConfig, modelBaseUrl, widenThreadPool } from "../../shared/config/config.js";
import type { Config } from "../../shared/config/config-types.js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../shared/gen/grpc/health/v1/health_pb.js";
import { describeTrim, startIdleTrim } from "../../shared/process/idle-trim.js";
import { createLogger, routeNodeWarnings } from "../../shared/process/log.js";
import { GatewayService } from "../../shared/gen/troupe/v1/gateway_pb.js";
import { MemoryService } from "../../shared/gen/troupe/v1/memory_pb.js";
import { RouterService } from "../../shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../../shared/gen/troupe/v1/runner_pb.js";
import { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import { createClient } from "../../shared/rpc.js";
import { splitHostPort } from "../../shared/net/host-port.js";
import { freePort } from "../free-port.js";
import { startLocalPostgres, type LocalPostgres } from "./local-postgres.js";
import { runInOneProcess } from "./one-process.js";
import type { Child } from "./child.js";
import { inUse, inUseMessage, type Listener } from "./ports-in-use.js";
import { allocatorEnvironment, startOver } from "../allocator.js";
import { exitProcess } from "../../shared/process/exit.js";
import { jitFlags } from "../jit.js";
import { upFileWriter } from "./file.js";
import { reapLeftovers, removeSandboxes } from "./leftovers.js";

const MAIN = fileURLToPath(new URL("../main.js", import.meta.url));

const LOG_ROTATE_BYTES = 64 * 1024 * 1024;

/** How many of each service `troupe up` starts, and where the store is (its own flags). */
export interface Shape {
  runners: number;
  gateways: number;
  routers: number;
  /** "postgres": a PostgreSQL server of our own in <data-dir>/postgres, unless TROUPE_STORE_URL is set. */
  store: "files" | "postgres";
  /** Every service in this process, each on its own ports (one-process.ts). */
  oneProcess: boolean;
}

/** Takes `troupe up`'s own flags out of `args`; the rest are the services' flags. */
export function parseShape(args: string[]): { shape: Shape; rest: string[] } {
  const shape: Shape = { runners: 1, gateways: 1, routers: 1, store: "files", oneProcess: false };
  const rest: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const [flag, inline] = args[i].split("=", 2);
    const value = () => inline ?? args[++i] ?? "";
    if (flag === "--runners" || flag === "--gateways" || flag === "--routers") {
      const v = value();
      if (!/^[1-9]\d{0,1}$/.test(v)) throw new Error(`${flag} must be a whole number from 1 to 99, not "${v}"`);
      shape[flag.slice(2) as "runners" | "gateways" | "routers"] = Number(v);
    } else if (flag === "--store") {
      const v = value();
      if (v !== "files" && v !== "postgres") throw new Error(`--store must be files or postgres, not "${v}"`);
      shape.store = v;
    } else if (args[i] === "--one-process") {
      shape.oneProcess = true;
    } else rest.push(args[i]);
  }
  if (shape.oneProcess && shape.runners + shape.gateways + shape.routers > 3)
    throw new Error("--one-process runs one of each service; --runners, --gateways and --routers need processes");
  return { shape, rest };
}

/** Every address the children will listen on: gRPC, the gateways' HTTP, the metrics ports. */
function listenersOf(children: readonly Child[]): Listener[] {
  const out: Listener[] = [];
  for (const c of children) {
    out.push({ name: c.name, address: c.address });
    for (const flag of ["--http", "--metrics"]) {
      const i = c.args.indexOf(flag);
      if (i >= 0 && c.args[i + 1] !== "off") out.push({ name: `${c.name} ${flag.slice(2)}`, address: c.args[i + 1] });
    }
  }
  return out;
}

/**
 * How `troupe up` and its services log: its output is read by people (this terminal, a nohup
 * file, troupe logs), so plain lines unless JSON is asked for (a log shipper reading the files),
 * and the same for the supervisor's own lines as for its services'.
 */
function upLogFormat(cfg: Config): "json" | "text" {
  return cfg.logFormat === "auto" ? "text" : cfg.logFormat;
}

export async function upCommand(argv: string[]): Promise<void> {
  const { shape, rest: args } = parseShape(argv);
  const cfg = loadConfig(args);
  if (shape.oneProcess) {
    // Its young generation is not capped: idle-trim.ts gives back what a quiet process grew, and
    // a cap cost latency under load (bench/history.md, footprint).
    startOver(cfg.allocator, childEnvironment());
    // Services in this process append fsynced session logs: widen the pool before it first starts.
    widenThreadPool();
  }
  const logger = createLogger("up", cfg.logLevel, upLogFormat(cfg));
  routeNodeWarnings(logger);
  const upFile = path.join(cfg.dataDir, "up.json");
  await reapLeftovers(upFile, cfg.dataDir, cfg, MAIN, logger);
  let storeUrl = cfg.storeUrl;
  let localStore: LocalPostgres | undefined;
  if (!storeUrl && shape.store === "postgres") {
    localStore = await startLocalPostgres(path.join(path.resolve(cfg.dataDir), "postgres"));
    storeUrl = localStore.url;
    logger.info(`PostgreSQL of this data directory on 127.0.0.1:${localStore.port} (pid ${localStore.pid})`);
  }
  if (!storeUrl && shape.routers > 1)
    throw new Error(
      "more than one router needs runner membership in a shared store: set TROUPE_STORE_URL or pass --store postgres",
    );
  const shared = [
    "--data-dir",
    cfg.dataDir,
    "--gateway",
    cfg.addr.gateway,
    "--router",
    cfg.addr.router,
    "--runner",
    cfg.addr.runner,
    "--memory",
    cfg.addr.memory,
    "--sandbox",
    cfg.addr.sandbox,
    "--model-server",
    cfg.addr.model,
    "--max-message-bytes",
    String(cfg.maxMessageBytes),
    "--api-keys",
    cfg.apiKeysFile,
    // The gateway serves TLS with these; the other services too when internal TLS is on.
    ...(cfg.tls ? ["--tls-cert", cfg.tls.certFile, "--tls-key", cfg.tls.keyFile] : []),
    ...(cfg.internalCa ? ["--internal-ca", cfg.internalCa] : []),
  ];
  const children: Child[] = [];
  const add = (name: string, address: string, extra: string[] = []): void => {
    children.push({ name, address, args: [name.replace(/-\d+$/, ""), ...shared, ...extra], restarts: 0, startedAt: 0 });
  };
  if (cfg.providersFile) {
    logger.info(`model providers from ${cfg.providersFile}, model ${cfg.model}`);
  } else if (!cfg.openaiBaseUrl) {
    add("model-server", cfg.addr.model);
    logger.warn(
      `OPENAI_BASE_URL is not set: using Troupe's scripted model server at ${modelBaseUrl(cfg)} (deterministic replies, see docs/scripted-model.md). Set OPENAI_BASE_URL, OPENAI_API_KEY and TROUPE_MODEL (or TROUPE_PROVIDERS_FILE) to use a real model.`,
    );
  } else {
    logger.info(`model endpoint ${cfg.openaiBaseUrl}, model ${cfg.model}`);
  }
  // Extra instances take free ports; the first of each keeps its configured address.
  const instances = async (n: number, first: string) => {
    const out = [first];
    for (let i = 1; i < n; i++) out.push(`127.0.0.1:${await freePort()}`);
    return out;
  };
  const routers = await instances(shape.routers, cfg.addr.router);
  for (const [i, a] of routers.entries()) add(i ? `router-${i + 1}` : "router", a, ["--router", a]);
  add("memory", cfg.addr.memory);
  add("sandbox", cfg.addr.sandbox);
  for (const [i, a] of (await instances(shape.runners, cfg.addr.runner)).entries())
    add(i ? `runner-${i + 1}` : "runner", a, [
      "--runner",
      a,
      "--advertise",
      a,
      "--router",
      routers[i % routers.length],
      ...(shape.runners > 1 ? ["--runner-id", `runner-${i + 1}`] : []),
    ]);
  const gateways = await instances(shape.gateways, cfg.addr.gateway);
  // Each gateway's HTTP face on a port of its own: the configured one first.
  const https = cfg.httpAddr ? await instances(shape.gateways, cfg.httpAddr) : gateways.map(() => "off");
  for (const [i, a] of gateways.entries())
    add(i ? `gateway-${i + 1}` : "gateway", a, [
      "--gateway",
      a,
      "--router",
      routers[i % routers.length],
      "--http",
      https[i],
    ]);
  // Prometheus ports: the configured one for the first service, the next ones for the rest.
  if (cfg.metricsAddr) {
    const [host, first] = splitHostPort(cfg.metricsAddr);
    for (const [i, child] of children.filter((c) => c.name !== "model-server").entries())
      child.args.push("--metrics", `${host}:${first + i}`);
  }
  const taken = await inUse(listenersOf(children));
  if (taken.length > 0) {
    await localStore?.stop();
    throw new Error(inUseMessage(taken));
  }
  // Made before the children start, so they all read the same files (auth.ts).
  await internalToken(cfg.dataDir, cfg.internalToken);
  const dev = await ensureDevKey(cfg.dataDir, cfg.apiKeysFile);
  const env = allocatorEnvironment(cfg.allocator, {
    ...childEnvironment(),
    TROUPE_LOG_FORMAT: upLogFormat(cfg),
    ...(storeUrl ? { TROUPE_STORE_URL: storeUrl } : {}),
  });
  const upWriter = upFileWriter(
    upFile,
    () => ({
      supervisor: process.pid,
      ...(localStore
        ? { store: { service: "postgres", address: `127.0.0.1:${localStore.port}`, pid: localStore.pid } }
        : {}),
      services: children.map((c) => ({
        service: c.name,
        address: c.address,
        pid: shape.oneProcess ? process.pid : (c.proc?.pid ?? null),
      })),
    }),
    (err) => logger.warn(`cannot write ${upFile}: ${err.message}`),
  );
  const writeUp = () => upWriter.write();
  // The stack's sandboxes go with it (a sandbox service restarted alone keeps them).
  const cleanup = async () => {
    await removeSandboxes(cfg.dataDir, cfg);
    await localStore?.stop();
    await upWriter.remove();
  };
  if (shape.oneProcess) {
    await runInOneProcess(children, env, cleanup);
    await writeUp();
  } else await superviseChildren(cfg, children, env, writeUp, cleanup);

  const missing = await waitReady(cfg, children, 60_000);
  if (missing.length === 0) {
    logger.info(
      `Troupe is up. Gateway${gateways.length > 1 ? "s" : ""}: ${gateways.join(", ")}${cfg.httpAddr ? ` (HTTP: ${https.join(", ")})` : ""}. Chat with it:  npx troupe chat   (or: npx troupe chat "hello")\n` +
        `  development API key (tenant local, principal dev${dev.created ? ", made just now" : ""}): ${dev.key}\n` +
        `  kept in ${authPaths(cfg.dataDir).devKey}; troupe chat uses it unless TROUPE_API_KEY is set. Other clients send it as \`authorization: Bearer <key>\`.\n` +
        `  what runs where: ${upFile}`,
    );
  } else {
    logger.error(`not ready after 60 s: ${missing.join(", ")}; see the logs above`);
  }
}

/**
 * A second SIGINT or SIGTERM this soon after the first is the same stop, not a demand to kill:
 * `timeout make run` delivers two within milliseconds (the process group's and make's forward of
 * it), and killing the children then leaves the sandbox's pooled containers behind. A person
 * pressing Ctrl-C again, later, still forces the stop.
 */
const SAME_STOP_MS = 1000;

/**
 * Runs each child as a process of its own: restarted after a backoff when it dies, stopped (the
 * gateways first) on SIGINT or SIGTERM, its output to this terminal and <data-dir>/logs.
 */
async function superviseChildren(
  cfg: Config,
  children: Child[],
  env: NodeJS.ProcessEnv,
  writeUp: () => Promise<void>,
  cleanup: () => Promise<void>,
): Promise<void> {
  const logger = createLogger("up", cfg.logLevel, upLogFormat(cfg));
  /** When the first stop signal came; undefined while running. */
  let stoppingSince: number | undefined;

  // Each child's output goes to the terminal and to <data-dir>/logs/<name>.log (troupe logs),
  // which is moved aside to <name>.log.1 when a start finds it over LOG_ROTATE_BYTES.
  const logDir = path.join(cfg.dataDir, "logs");
  await mkdir(logDir, { recursive: true });
  const start = async (child: Child) => {
    child.startedAt = Date.now();
    const logFile = path.join(logDir, `${child.name}.log`);
    if (((await stat(logFile).catch(() => undefined))?.size ?? 0) > LOG_ROTATE_BYTES)
      await rename(logFile, `${logFile}.1`).catch(() => undefined);
    const log = createWriteStream(logFile, { flags: "a" });
    log.on("error", (err) => logger.warn(`cannot write ${logFile}: ${err.message}`));
    const nodeFlags = jitFlags(child.args[0], cfg.jit);
    const proc = spawn(process.execPath, [...nodeFlags, MAIN, ...child.args], {
      stdio: ["ignore", "pipe", "pipe"],
      env,
    });
    proc.stdout!.on("data", (d: Buffer) => (process.stdout.write(d), log.write(d)));
    proc.stderr!.on("data", (d: Buffer) => (process.stderr.write(d), log.write(d)));
    proc.once("close", () => log.end());
    child.proc = proc;
    void writeUp();
    proc.on("exit", (code, signal) => {
      child.proc = undefined;
      if (stoppingSince !== undefined) return;
      void writeUp();
      // A child that ran for a minute is considered healthy again: its backoff starts over.
      if (Date.now() - child.startedAt > 60_000) child.restarts = 0;
      const delay = Math.min(30_000, 500 * 2 ** child.restarts++);
      logger.error(`${child.name} exited (${signal ?? `code ${code}`}); restarting in ${delay} ms`);
      setTimeout(() => stoppingSince === undefined && void start(child), delay);
    });
  };
  for (const child of children) await start(child);
  // The supervisor too grows while it starts everything and then mostly waits.
  const trimmer = startIdleTrim({ idleMs: cfg.idleTrimMs, onTrim: (t) => logger.debug(describeTrim(t)) });

  const stop = (signal: string) => {
    if (stoppingSince !== undefined) {
      if (Date.now() - stoppingSince < SAME_STOP_MS) return;
      logger.warn("second signal: killing children");
      for (const c of children) c.proc?.kill("SIGKILL");
      void exitProcess(130);
      return;
    }
    stoppingSince = Date.now();
    trimmer.stop();
    logger.info(`${signal}: stopping all services`);
    // The gateways first, so no new work arrives while the others drain.
    const order = [...children].reverse();
    void (async () => {
      for (const c of order) {
        const proc = c.proc;
        if (!proc) continue;
        const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
        proc.kill("SIGTERM");
        const timer = setTimeout(() => proc.kill("SIGKILL"), cfg.drainGraceMs + 5000);
        await exited;
        clearTimeout(timer);
      }
      await cleanup();
      logger.info("all services stopped");
      await exitProcess(0);
    })();
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
}

/**
 * The gRPC service each process serves, the name its health is asked by. Asking by name, not "",
 * matters: a port answered by some other Troupe process (one left from an earlier run, or two
 * services configured on one port) says NOT_FOUND rather than SERVING.
 */
export const SERVICE_TYPE = {
  router: RouterService.typeName,
  memory: MemoryService.typeName,
  sandbox: SandboxService.typeName,
  runner: RunnerService.typeName,
  gateway: GatewayService.typeName,
} as const;

/**
 * Waits until every service answers its health check and at least one runner is live (registered
 * with the router, or beating in the store). A sandbox without a Docker engine answers
 * NOT_SERVING: that counts as up (the rest of Troupe works; tools report the error), with a
 * warning. Returns what is still not ready.
 */
async function waitReady(cfg: Config, children: Child[], timeoutMs: number): Promise<string[]> {
  const logger = createLogger("up", cfg.logLevel, upLogFormat(cfg));
  const deadline = Date.now() + timeoutMs;
  const services = children.filter((c) => c.name !== "model-server");
  const pending = new Set([...services.map((c) => c.name), "runner registration"]);
  const internal = await internalCredentials(cfg.dataDir, cfg.internalToken, cfg.internalCa);
  const router = createClient(RouterService, cfg.addr.router, { headers: internal.headers, tls: internal.tls });
  // The gateway serves TLS with a certificate (its own CA is the clients' business); the others
  // when internal TLS is on, under the internal CA.
  const gatewayCa = cfg.tlsCa ? await readFile(cfg.tlsCa) : internal.tls?.ca;
  const gatewayTls = cfg.tls ? { ca: gatewayCa } : undefined;
  try {
    while (pending.size > 0 && Date.now() < deadline) {
      for (const name of [...pending]) {
        if (name === "runner registration") {
          const n = await router.listRunners({}, { timeoutMs: 1000 }).then(
            (r) => r.runners.length,
            () => 0,
          );
          if (n > 0) pending.delete(name);
          continue;
        }
        const child = services.find((c) => c.name === name)!;
        const kind = child.args[0] as keyof typeof SERVICE_TYPE;
        const health = createClient(Health, child.address, { tls: kind === "gateway" ? gatewayTls : internal.tls });
        const status = await health.check({ service: SERVICE_TYPE[kind] }, { timeoutMs: 1000 }).then(
          (r) => r.status,
          () => undefined,
        );
        health.close();
        if (status === Serving.SERVING) pending.delete(name);
        else if (status === Serving.NOT_SERVING && kind === "sandbox") {
          logger.warn(
            "the sandbox is NOT_SERVING (no Docker engine): tool calls will fail until one runs; see docs/sandbox.md",
          );
          pending.delete(name);
        }
      }
      if (pending.size > 0) await new Promise((r) => setTimeout(r, 250));
    }
    return [...pending];
  } finally {
    router.close();
  }
}
