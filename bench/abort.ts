// bench/abort: time from an abort frame to the client's agent_end, once while the model streams
// and once while a sandbox command runs (`sleep 60`), each time checking that the command's
// process is gone. Baselines in the same run: a raw grpc-js unary round trip between two
// processes (the floor for any reply) and killing a container's processes with
// `docker exec ... killall -9` through the docker CLI (the floor for a kill).
//
//   node dist/bench/abort.js [--runs 30]
import { scopeKey } from "../services/sandbox/scope.js";
import { execFile } from "node:child_process";
import { parseArgs } from "node:util";
import { promisify } from "node:util";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { containerName, instanceOf } from "../services/sandbox/container-spec.js";
import { ChatSession } from "../test/helpers/session.js";
import { LOAD_QUOTAS, startStack } from "../test/helpers/stack.js";
import { rawRoundTrips } from "./support/raw-grpc.js";
import { pct } from "./support/stats.js";

const run = promisify(execFile);
const { values } = parseArgs({ options: { runs: { type: "string", default: "30" } } });
const RUNS = Number(values.runs);
const fmt = (xs: number[]) => `p50=${pct(xs, 50).toFixed(1)} ms p99=${pct(xs, 99).toFixed(1)} ms (n=${xs.length})`;

const stack = await startStack({ env: { ...LOAD_QUOTAS, TROUPE_LOG_LEVEL: "warn" } });
const sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
try {
  const streaming: number[] = [];
  const tool: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const s = new ChatSession(stack.gateway);
    s.open();
    const opened = await s.waitOpened();

    s.prompt("!tokens 100000 rate=1000");
    await s.waitForPayload("messageUpdate");
    let t0 = performance.now();
    s.send({ case: "abort", value: { reason: "bench" } });
    let end = await s.waitForPayload("agentEnd", 10_000);
    streaming.push(performance.now() - t0);
    if (end.payload.case !== "agentEnd" || end.payload.value.stopReason !== StopReason.ABORTED)
      throw new Error("streaming run did not end aborted");

    const from = s.events.length;
    s.prompt("$ echo started; sleep 60");
    await s.waitFor((e) => e.payload.case === "toolExecutionUpdate", 20_000, from);
    t0 = performance.now();
    s.send({ case: "abort", value: { reason: "bench" } });
    end = await s.waitForPayload("agentEnd", 10_000, from);
    tool.push(performance.now() - t0);
    if (end.payload.case !== "agentEnd" || end.payload.value.stopReason !== StopReason.ABORTED)
      throw new Error("tool run did not end aborted");
    s.close();

    // The process tree is dead: nothing of the command is left in the session's sandbox.
    let left = "";
    for await (const m of sandbox.exec({
      sessionId: opened.sessionId,
      command: "ps -o args | grep -c '[s]leep 60' || true",
    })) {
      if (m.kind.case === "stdout") left += Buffer.from(m.kind.value).toString();
    }
    if (left.trim() !== "0") throw new Error(`run ${i}: the sleep survived the abort (${left.trim()} left)`);
    await sandbox.releaseSandbox({ sessionId: opened.sessionId });
  }

  // Baseline 1: a raw grpc-js round trip to another process.
  const rtt = await rawRoundTrips(RUNS);

  // Baseline 2: the docker CLI killing a command's processes in a running container.
  const probe = `bench-abort-cli-${Date.now()}`;
  for await (const _ of sandbox.exec({ sessionId: probe, command: "true" })) void _;
  const name = containerName(instanceOf(stack.dataDir), scopeKey("session", DEV_IDENTITY, probe, ""));
  const cli: number[] = [];
  for (let i = 0; i < Math.min(RUNS, 20); i++) {
    await run("docker", ["exec", "-d", "-u", "65534:65534", name, "sleep", "60"]);
    const t0 = performance.now();
    // Not `kill -9 -1`: the sandbox's agent runs as the same user and would die with it.
    await run("docker", ["exec", "-u", "65534:65534", name, "killall", "-9", "sleep"]);
    cli.push(performance.now() - t0);
  }
  await sandbox.releaseSandbox({ sessionId: probe });

  console.log(`runs=${RUNS}`);
  console.log(`abort during model streaming -> agent_end: ${fmt(streaming)}`);
  console.log(`abort during a sandbox command (sleep 60, verified dead) -> agent_end: ${fmt(tool)}`);
  console.log(`baseline raw grpc-js round trip: ${fmt(rtt)}`);
  console.log(`baseline docker CLI exec killall -9: ${fmt(cli)}`);
  console.log(
    `RESULT abort_stream_p99_ms=${pct(streaming, 99).toFixed(1)} abort_tool_p99_ms=${pct(tool, 99).toFixed(1)}`,
  );
} finally {
  sandbox.close();
  await stack.stop();
}
