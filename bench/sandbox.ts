// bench/sandbox: what a tool call pays for its sandbox, against the docker CLI in the same run.
//   cold exec: the first command of a new session with no warm pool (create, start, greet the
//              agent, run `true`) vs `docker run --rm` of the same image with the same hardening;
//   warm exec: `true` in a session's running sandbox through the service vs `docker exec`;
//   file read: ReadFile of a 4 MB file in a session's running sandbox vs `docker exec cat` of it;
//   pool claim: taking a warm container for a new session (rename, claim), measured in-process
//              on the service's own fleet, and the first command of a session with a warm pool
//              through the service;
//   the warm exec's floor, in the same run: the two parts of it no code of the service can
//              shorten, added: a bare grpc-js call of two replies between two processes (the
//              started message and the exit), and `true` through the agent's channel, in-process
//              on a fleet (a frame each way through the engine's attach stream, and the fork).
//
//   node dist/bench/sandbox.js [--runtime runc|runsc] [--warm 200] [--cold 15]
import { scopeKey } from "../services/sandbox/scope.js";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { parseArgs } from "node:util";
import { Engine, engineAddress } from "../services/sandbox/engine.js";
import { loadConfig } from "../services/shared/config/config.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import type { ServiceClient } from "../services/shared/rpc.js";
import { createLogger } from "../services/shared/process/log.js";
import { SandboxFleet } from "../services/sandbox/fleet.js";
import { DEFAULT_LIMITS, containerName, instanceOf } from "../services/sandbox/container-spec.js";
import { LOAD_QUOTAS, startStack } from "../test/helpers/stack.js";
import { pct } from "./support/stats.js";
import { rawRoundTrips } from "./support/raw-grpc.js";
import { cpuMs } from "./support/cpu.js";
import { exitProcess } from "../services/shared/process/exit.js";

const run = promisify(execFile);
const { values } = parseArgs({
  options: {
    runtime: { type: "string", default: "runc" },
    warm: { type: "string", default: "200" },
    cold: { type: "string", default: "15" },
  },
});
const RUNTIME = values.runtime!;
const WARM = Number(values.warm);
const COLD = Number(values.cold);
/** Warm calls made before each warm figure is measured, unmeasured. */
const WARMUP = 500;
const IMAGE = process.env.TROUPE_SANDBOX_IMAGE ?? "troupe-sandbox:busybox";
const fmt = (xs: number[]) => `p50=${pct(xs, 50).toFixed(1)} ms p95=${pct(xs, 95).toFixed(1)} ms (n=${xs.length})`;
type Sandbox = ServiceClient<(typeof SandboxService)["method"]>;

async function timedExec(sandbox: Sandbox, sessionId: string, command = "true"): Promise<number> {
  const t0 = performance.now();
  let code = -1;
  for await (const m of sandbox.exec({ sessionId, command })) if (m.kind.case === "exit") code = m.kind.value.exitCode;
  if (code !== 0) throw new Error(`${command} exited ${code}`);
  return performance.now() - t0;
}

const env = { ...LOAD_QUOTAS, TROUPE_LOG_LEVEL: "warn", TROUPE_SANDBOX_RUNTIME: RUNTIME };

// Cold: no pool, so every new session makes its container.
const coldStack = await startStack({ services: ["sandbox"], env: { ...env, TROUPE_SANDBOX_POOL: "0" } });
const coldClient = coldStack.client(SandboxService, coldStack.addr.sandbox, { as: DEV_IDENTITY });
const cold: number[] = [];
const warm: number[] = [];
let cliExec: number[] = [];
const reads: number[] = [];
/** The sandbox service's CPU per warm exec, µs (clock ticks of 10 ms, over the whole loop). */
let serviceCpuUs = 0;
const cliReads: number[] = [];
/** The file read: 4 MB, under what one read returns (4 MiB less 64 KiB, the reply's room in a message). */
const FILE_BYTES = 4_000_000;
try {
  await timedExec(coldClient, "bench-cold-warmup");
  await coldClient.releaseSandbox({ sessionId: "bench-cold-warmup" });
  for (let i = 0; i < COLD; i++) {
    const id = `bench-cold-${i}`;
    cold.push(await timedExec(coldClient, id));
    await coldClient.releaseSandbox({ sessionId: id });
  }

  // Warm: one session's running sandbox, through the service and through the CLI.
  const id = "bench-warm";
  await timedExec(coldClient, id);
  // Warmed as a service that has run for a while is: V8 optimizes a function after some hundreds of calls.
  for (let i = 0; i < WARMUP; i++) await timedExec(coldClient, id);
  const servicePid = [coldStack.process("sandbox")!.pid!];
  const cpuBefore = cpuMs(servicePid);
  for (let i = 0; i < WARM; i++) warm.push(await timedExec(coldClient, id));
  serviceCpuUs = ((cpuMs(servicePid) - cpuBefore) * 1000) / WARM;
  const name = containerName(instanceOf(coldStack.dataDir), scopeKey("session", DEV_IDENTITY, id, ""));
  const cliRuns = Math.min(WARM, 50);
  for (let i = 0; i < cliRuns + 5; i++) {
    const t0 = performance.now();
    await run("docker", ["exec", name, "true"]);
    cliExec.push(performance.now() - t0);
  }
  cliExec = cliExec.slice(5);

  // File read: the same file through the service and through `docker exec cat`.
  await coldClient.writeFile({ sessionId: id, path: "/workspace/read.bin", data: new Uint8Array(FILE_BYTES).fill(7) });
  for (let i = 0; i < 23; i++) {
    let t0 = performance.now();
    const file = await coldClient.readFile({ sessionId: id, path: "/workspace/read.bin", maxBytes: 16 << 20 });
    if (file.data.length !== FILE_BYTES) throw new Error(`read ${file.data.length} of ${FILE_BYTES} bytes`);
    if (i >= 3) reads.push(performance.now() - t0);
    t0 = performance.now();
    await run("docker", ["exec", name, "cat", "/workspace/read.bin"], { encoding: "buffer", maxBuffer: 8 << 20 });
    if (i >= 3) cliReads.push(performance.now() - t0);
  }
  await coldClient.releaseSandbox({ sessionId: id });
} finally {
  coldClient.close();
  await coldStack.stop();
}

// The CLI's cold start, same image and hardening.
const cliRun: number[] = [];
const runArgs = [
  "run",
  "--rm",
  "--runtime",
  RUNTIME,
  "--network",
  "none",
  "--cap-drop",
  "ALL",
  "--security-opt",
  "no-new-privileges",
  "--read-only",
  "--init",
  "--pids-limit",
  "256",
  "--memory",
  "512m",
  "--memory-swap",
  "512m",
  "--cpus",
  "1",
  "--tmpfs",
  "/tmp:rw,nosuid,nodev,noexec,size=64m",
  "--tmpfs",
  "/workspace:rw,exec,nosuid,nodev,size=256m",
  "--user",
  "65534:65534",
  "--log-driver",
  "none",
  "--entrypoint",
  "/bin/true",
  IMAGE,
];
for (let i = 0; i < COLD + 1; i++) {
  const t0 = performance.now();
  await run("docker", runArgs);
  if (i > 0) cliRun.push(performance.now() - t0);
}

// Pool claim, in-process on a fleet of its own: the time from asking for a new key's sandbox to
// having it, with a warm container waiting.
const logger = createLogger("bench", "warn");
// The engine the sandbox service would use (DOCKER_HOST and its TLS settings), as the docker CLI above.
const engine = new Engine(engineAddress(loadConfig([])));
const fleet = new SandboxFleet(
  engine,
  {
    image: IMAGE,
    runtime: RUNTIME,
    instance: `bench${Date.now().toString(36)}`,
    limits: DEFAULT_LIMITS,
    poolSize: 1,
    idleMs: 3600_000,
    maxAgeMs: 3600_000,
  },
  logger,
);
const claim: number[] = [];
const agentRoundTrips: number[] = [];
try {
  for (let i = 0; i < COLD; i++) {
    fleet.fill();
    // The pool (of one) is full again before each claim.
    for (let waited = 0; fleet.pooled < 1; waited += 20) {
      if (waited > 30_000) throw new Error("the pool did not fill");
      await new Promise((r) => setTimeout(r, 20));
    }
    const key = `session:bench-claim-${i}`;
    const t0 = performance.now();
    await fleet.get(key);
    claim.push(performance.now() - t0);
    await fleet.release(key);
  }
  // The agent's part of a warm exec: `true` over the channel the service holds, no gRPC.
  const sandbox = await fleet.get("session:bench-agent");
  const agentExec = () =>
    new Promise<void>((resolve, reject) => {
      const options = { timeoutMs: 10_000, maxOutputBytes: 1 << 20, windowBytes: 256 * 1024 };
      sandbox.agent.exec("true", options, {
        output: () => undefined,
        exit: (exit) => (exit.exitCode === 0 ? resolve() : reject(new Error(`true exited ${exit.exitCode}`))),
        lost: reject,
      });
    });
  for (let i = 0; i < WARMUP; i++) await agentExec();
  for (let i = 0; i < WARM; i++) {
    const t0 = performance.now();
    await agentExec();
    agentRoundTrips.push(performance.now() - t0);
  }
  await fleet.release("session:bench-agent");
} finally {
  await fleet.shutdown();
  engine.close();
}

// And through the service: a new session's first command with a warm pool.
const poolStack = await startStack({ services: ["sandbox"], env: { ...env, TROUPE_SANDBOX_POOL: "1" } });
const poolClient = poolStack.client(SandboxService, poolStack.addr.sandbox, { as: DEV_IDENTITY });
const firstWithPool: number[] = [];
try {
  for (let i = 0; i < COLD; i++) {
    // Wait for the pool to refill (the listing shows an unclaimed pooled container).
    for (let t = 0; t < 300; t++) {
      const { sandboxes } = await poolClient.listSandboxes({});
      if (sandboxes.some((s) => s.pooled && s.scopeKey === "" && s.state === "running")) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const id = `bench-pool-${i}`;
    firstWithPool.push(await timedExec(poolClient, id));
    await poolClient.releaseSandbox({ sessionId: id });
  }
} finally {
  poolClient.close();
  await poolStack.stop();
}

// The gRPC part of the floor: a call of one request and two replies, to its status, as timedExec waits.
const grpcCalls = (await rawRoundTrips(WARMUP + WARM, { replies: 2, untilEnd: true })).slice(WARMUP);
const floor = pct(grpcCalls, 50) + pct(agentRoundTrips, 50);

const ratio = (a: number[], b: number[]) => (pct(a, 50) / pct(b, 50)).toFixed(2);
console.log(`runtime=${RUNTIME} image=${IMAGE}`);
console.log(`cold exec through the service (no pool):      ${fmt(cold)}`);
console.log(`baseline docker run --rm through the CLI:     ${fmt(cliRun)}`);
console.log(`warm exec through the service:                ${fmt(warm)}, its CPU ${serviceCpuUs.toFixed(0)} µs each`);
console.log(`baseline docker exec through the CLI:         ${fmt(cliExec)}`);
console.log(`4 MB file read through the service:           ${fmt(reads)}`);
console.log(`baseline docker exec cat through the CLI:     ${fmt(cliReads)}`);
console.log(`pool claim (in-process fleet):                ${fmt(claim)}`);
console.log(`first exec of a session with a warm pool:     ${fmt(firstWithPool)}`);
console.log(`floor: bare grpc-js call, two replies:       ${fmt(grpcCalls)}`);
console.log(`floor: \`true\` through the agent, in-process: ${fmt(agentRoundTrips)}`);
console.log(
  `warm exec p50 against the floor's (the two p50s added, ${floor.toFixed(2)} ms): ${(pct(warm, 50) / floor).toFixed(2)}`,
);
console.log(
  `RESULT warm_exec_p50_ms=${pct(warm, 50).toFixed(2)} warm_floor_ms=${floor.toFixed(2)} warm_vs_floor=${(pct(warm, 50) / floor).toFixed(2)} service_cpu_us=${serviceCpuUs.toFixed(0)} warm_vs_cli_exec=${ratio(warm, cliExec)} cold_vs_cli_run=${ratio(cold, cliRun)} pool_claim_p50_ms=${pct(claim, 50).toFixed(2)} read_4mb_p50_ms=${pct(reads, 50).toFixed(1)} read_vs_cli_cat=${ratio(reads, cliReads)}`,
);
await exitProcess(0);
