// `troupe up`: the whole stack as child processes of one supervisor. A child that dies is started
// again after a backoff; Ctrl-C (or SIGTERM) drains every child and exits when they are gone.
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { authPaths, ensureDevKey, internalCredentials, internalToken } from "../shared/auth.js";
import { childEnvironment, loadConfig, modelBaseUrl, type Config } from "../shared/config.js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../shared/gen/grpc/health/v1/health_pb.js";
import { createLogger } from "../shared/log.js";
import { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import { MemoryService } from "../shared/gen/troupe/v1/memory_pb.js";
import { RouterService } from "../shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../shared/gen/troupe/v1/runner_pb.js";
import { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { createClient } from "../shared/rpc.js";

const MAIN = fileURLToPath(new URL("./main.js", import.meta.url));

interface Child {
  name: string;
  args: string[];
  proc?: ChildProcess;
  restarts: number;
  startedAt: number;
}

export async function upCommand(args: string[]): Promise<void> {
  const cfg = loadConfig(args);
  const logger = createLogger("up", cfg.logLevel);
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
  ];
  const names = ["router", "memory", "sandbox", "runner", "gateway"];
  if (cfg.providersFile) {
    logger.info(`model providers from ${cfg.providersFile}, model ${cfg.model}`);
  } else if (!cfg.openaiBaseUrl) {
    names.unshift("model-server");
    logger.warn(
      `OPENAI_BASE_URL is not set: using Troupe's scripted model server at ${modelBaseUrl(cfg)} (deterministic replies, see docs/scripted-model.md). Set OPENAI_BASE_URL, OPENAI_API_KEY and TROUPE_MODEL (or TROUPE_PROVIDERS_FILE) to use a real model.`,
    );
  } else {
    logger.info(`model endpoint ${cfg.openaiBaseUrl}, model ${cfg.model}`);
  }
  // Made before the children start, so they all read the same files (auth.ts).
  await internalToken(cfg.dataDir, cfg.internalToken);
  const dev = await ensureDevKey(cfg.dataDir, cfg.apiKeysFile);
  const children: Child[] = names.map((name) => ({ name, args: [name, ...shared], restarts: 0, startedAt: 0 }));
  let stopping = false;

  const start = (child: Child) => {
    child.startedAt = Date.now();
    const proc = spawn(process.execPath, [MAIN, ...child.args], {
      stdio: ["ignore", "inherit", "inherit"],
      env: childEnvironment(),
    });
    child.proc = proc;
    proc.on("exit", (code, signal) => {
      child.proc = undefined;
      if (stopping) return;
      // A child that ran for a minute is considered healthy again: its backoff starts over.
      if (Date.now() - child.startedAt > 60_000) child.restarts = 0;
      const delay = Math.min(30_000, 500 * 2 ** child.restarts++);
      logger.error(`${child.name} exited (${signal ?? `code ${code}`}); restarting in ${delay} ms`);
      setTimeout(() => !stopping && start(child), delay);
    });
  };
  for (const child of children) start(child);

  const stop = (signal: string) => {
    if (stopping) {
      logger.warn("second signal: killing children");
      for (const c of children) c.proc?.kill("SIGKILL");
      process.exit(130);
    }
    stopping = true;
    logger.info(`${signal}: stopping all services`);
    // The gateway first, so no new work arrives while the others drain.
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
      logger.info("all services stopped");
      process.exit(0);
    })();
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));

  const missing = await waitReady(cfg, 60_000);
  if (missing.length === 0) {
    logger.info(
      `Troupe is up. Gateway: ${cfg.addr.gateway}. Chat with it:  npx troupe chat   (or: npx troupe chat "hello")\n` +
        `  development API key (tenant local, principal dev${dev.created ? ", made just now" : ""}): ${dev.key}\n` +
        `  kept in ${authPaths(cfg.dataDir).devKey}; troupe chat uses it unless TROUPE_API_KEY is set. Other clients send it as \`authorization: Bearer <key>\`.`,
    );
  } else {
    logger.error(`not ready after 60 s: ${missing.join(", ")}; see the logs above`);
  }
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
 * Waits until every service answers its health check and the runner has registered with the
 * router. A sandbox without a Docker engine answers NOT_SERVING: that counts as up (the rest of
 * Troupe works; tools report the error), with a warning. Returns what is still not ready.
 */
async function waitReady(cfg: Config, timeoutMs: number): Promise<string[]> {
  const logger = createLogger("up", cfg.logLevel);
  const deadline = Date.now() + timeoutMs;
  const pending = new Set(["router", "memory", "sandbox", "runner", "gateway", "runner registration"]);
  const addresses: Record<string, string> = {
    router: cfg.addr.router,
    memory: cfg.addr.memory,
    sandbox: cfg.addr.sandbox,
    runner: cfg.addr.runner,
    gateway: cfg.addr.gateway,
  };
  const router = createClient(RouterService, cfg.addr.router, {
    headers: (await internalCredentials(cfg.dataDir, cfg.internalToken)).headers,
  });
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
        const health = createClient(Health, addresses[name]);
        const status = await health
          .check({ service: SERVICE_TYPE[name as keyof typeof SERVICE_TYPE] }, { timeoutMs: 1000 })
          .then(
            (r) => r.status,
            () => undefined,
          );
        health.close();
        if (status === Serving.SERVING) pending.delete(name);
        else if (status === Serving.NOT_SERVING && name === "sandbox") {
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
