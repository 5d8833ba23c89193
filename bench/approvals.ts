// bench/approvals: what a run that waits on a person costs, beside an idle session in the same run.
// Every session is raised through the gateway against the scripted model:
//
// - idle_kb: runner heap (after a GC) per idle actor: one completed turn each (the baseline);
// - waiting_kb: the same per session whose run waits on an approval: its agent asks before
//   every tool ("*": "ask"), and its one turn called manage_schedule, so the run stopped in
//   RunWaiting with one held call;
// - decision_p99_ms: a ToolDecision (approve) sent on a Chat stream -> that stream's
//   tool_execution_start, over a sample of the waiting sessions, one decision at a time (a
//   person's decision: the latency the goal is about), with all N waiting;
// - burst_p99_ms and decisions_per_s: as many more decisions, --decide-concurrency at a time
//   (16): how fast the runner works through a burst, and what queueing for its CPU adds;
// - the floor: raw grpc-js round trips to a bare server in another process, as many, one at a
//   time, with the N sessions still waiting (the decision's path is two such hops each way).
//
// The runner runs with --expose-gc; memory lookups are off (TROUPE_MEMORY_CONTEXT_K=0).
//
//   node dist/bench/approvals.js [--sessions 10000] [--concurrency 64] [--decisions 1000]
//                                [--decide-concurrency 16]
import { parseArgs } from "node:util";
import { RunnerService } from "../services/shared/gen/troupe/v1/runner_pb.js";
import { ToolVerdict } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "../test/helpers/session.js";
import { LOAD_QUOTAS, startStack, writeAgent, type Stack } from "../test/helpers/stack.js";
import { cpuMs } from "./support/cpu.js";
import { rawRoundTrips } from "./support/raw-grpc.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    sessions: { type: "string", default: "10000" },
    concurrency: { type: "string", default: "64" },
    decisions: { type: "string", default: "1000" },
    "decide-concurrency": { type: "string", default: "16" },
  },
});
const N = Number(values.sessions);
const CONCURRENCY = Number(values.concurrency);
const DECISIONS = Math.min(Number(values.decisions), Math.floor(N / 2));
const DECIDING = Number(values["decide-concurrency"]);
const kb = (bytes: number) => (bytes / 1024).toFixed(2);

async function pool(count: number, task: (i: number) => Promise<void>, concurrency = CONCURRENCY): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, count) }, async () => {
      while (next < count) await task(next++);
    }),
  );
}

/** One prompt on a new session of `agentId`, until `done` is seen; the stream is left without a reset. */
async function raise(stack: Stack, sessionId: string, agentId: string, text: string, done: string): Promise<string> {
  const s = new ChatSession(stack.gateway);
  try {
    s.send({ case: "open", value: { sessionId, agentId, create: true } });
    await s.waitOpened(30_000);
    s.prompt(text);
    const seen = await s.waitFor((e) => e.payload.case === done, 30_000);
    const held = s.events.find((e) => e.payload.case === "toolApprovalRequested");
    const status = await s.finish();
    if (status.code !== 0) throw new Error(`session ${sessionId} ended with ${status.code} ${status.details}`);
    return held?.payload.case === "toolApprovalRequested" ? held.payload.value.toolCallId : seen.turnId;
  } catch (err) {
    s.close();
    throw err;
  }
}

/** Approves the held call on a Chat stream; ms from sending the decision to the tool's start. */
async function decide(stack: Stack, sessionId: string, toolCallId: string): Promise<number> {
  const s = new ChatSession(stack.gateway);
  try {
    s.open(sessionId, false);
    await s.waitOpened(30_000);
    const t0 = performance.now();
    s.send({ case: "toolDecision", value: { toolCallId, verdict: ToolVerdict.APPROVE } });
    await s.waitFor((e) => e.payload.case === "toolExecutionStart", 30_000);
    const ms = performance.now() - t0;
    await s.waitFor((e) => e.payload.case === "agentEnd", 30_000);
    await s.finish();
    return ms;
  } catch (err) {
    s.close();
    throw err;
  }
}

const stack = await startStack({
  services: ["model-server", "router", "runner", "gateway"],
  env: {
    ...LOAD_QUOTAS,
    TROUPE_LOG_LEVEL: "warn",
    TROUPE_MEMORY_CONTEXT_K: "0",
    NODE_OPTIONS: "--expose-gc",
    TROUPE_TENANT_RATE: "1000000",
    TROUPE_TENANT_BURST: "1000000",
    TROUPE_TENANT_STREAMS: "1000000",
  },
});
await writeAgent(stack.dataDir, "guarded", { approvals: { tools: { "*": "ask" } } });
const runner = stack.client(RunnerService, stack.addr.runner);
const stats = () => runner.getRunnerStats({ collectGarbage: true });
const ASK = '!call manage_schedule {"action": "list"}';
try {
  // Warm both paths, then empty the runner: the heap with no actors is the reference.
  await pool(200, async (i) => void (await raise(stack, `warm-idle-${i}`, "main", "hello", "agentEnd")));
  const warmCalls: string[] = [];
  await pool(200, async (i) => {
    warmCalls[i] = await raise(stack, `warm-wait-${i}`, "guarded", ASK, "runWaiting");
  });
  await pool(200, async (i) => void (await decide(stack, `warm-wait-${i}`, warmCalls[i])), 16);
  await runner.passivateIdle({ idleForMs: 0 });
  await new Promise((r) => setTimeout(r, 3000));
  const empty = await stats();
  if (!empty.garbageCollected) throw new Error("the runner did not collect garbage; is --expose-gc passed?");

  await pool(N, async (i) => void (await raise(stack, `idle-${i}`, "main", "hello", "agentEnd")));
  await new Promise((r) => setTimeout(r, 3000));
  const idle = await stats();
  await runner.passivateIdle({ idleForMs: 0 });
  const between = await stats();

  const calls: string[] = new Array(N);
  const t0 = performance.now();
  await pool(N, async (i) => {
    calls[i] = await raise(stack, `wait-${i}`, "guarded", ASK, "runWaiting");
  });
  const raiseS = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 3000));
  // A waiting session stays in memory (its deadline is a timer there): passivation leaves it.
  await runner.passivateIdle({ idleForMs: 0 });
  const waiting = await stats();

  // One at a time: a decision's own latency, nothing queued beside it.
  const latencies: number[] = [];
  await pool(DECISIONS, async (i) => void latencies.push(await decide(stack, `wait-${i}`, calls[i])), 1);
  // A burst, on as many other waiting sessions. Where its CPU goes: each decision opens a stream,
  // resumes a turn (one more model call) and ends it, so a decision's whole round costs more
  // than its measured part.
  const processes = ["runner", "gateway", "model-server"] as const;
  const cpuOf = () => [...processes.map((p) => cpuMs([stack.process(p)!.pid!])), process.cpuUsage()];
  const cpuBefore = cpuOf();
  const burstFrom = performance.now();
  const burst: number[] = [];
  const later = (i: number) => `wait-${DECISIONS + i}`;
  await pool(DECISIONS, async (i) => void burst.push(await decide(stack, later(i), calls[DECISIONS + i])), DECIDING);
  const burstS = (performance.now() - burstFrom) / 1000;
  const cpuAfter = cpuOf();
  const perDecision = processes.map(
    (p, i) => `${p} ${(((cpuAfter[i] as number) - (cpuBefore[i] as number)) / DECISIONS).toFixed(2)}`,
  );
  const client = process.cpuUsage(cpuBefore[3] as NodeJS.CpuUsage);
  perDecision.push(`client ${((client.user + client.system) / 1000 / DECISIONS).toFixed(2)}`);
  const rtt = await rawRoundTrips(DECISIONS);

  const idleKb = (Number(idle.heapUsedBytes) - Number(empty.heapUsedBytes)) / idle.liveSessions;
  const waitingKb =
    (Number(waiting.heapUsedBytes) - Number(between.heapUsedBytes)) / (waiting.liveSessions - between.liveSessions);
  console.log(`raised ${N} waiting sessions in ${raiseS.toFixed(1)} s (${CONCURRENCY} at a time)`);
  console.log(
    `runner heap: ${kb(Number(empty.heapUsedBytes))} KB with no actors; ${kb(Number(idle.heapUsedBytes))} KB with ${idle.liveSessions} idle; ${kb(Number(between.heapUsedBytes))} KB after passivating them; ${kb(Number(waiting.heapUsedBytes))} KB with ${waiting.liveSessions} waiting`,
  );
  console.log(`idle session: ${kb(idleKb)} KB each (baseline); waiting session: ${kb(waitingKb)} KB each (goal <= 16)`);
  const p99 = pct(latencies, 99);
  const burstP99 = pct(burst, 99);
  const rate = DECISIONS / burstS;
  console.log(
    `decision -> tool start over ${latencies.length} decisions with ${N} waiting, one at a time: p50=${pct(latencies, 50).toFixed(1)} p99=${p99.toFixed(1)} ms (goal p99 <= 20)`,
  );
  console.log(
    `a burst of ${burst.length} more, ${DECIDING} at a time: p50=${pct(burst, 50).toFixed(1)} p99=${burstP99.toFixed(1)} ms; ${rate.toFixed(0)} a second (each a stream opened, the turn resumed and ended); CPU ms a decision: ${perDecision.join(", ")}`,
  );
  const rttP99 = pct(rtt, 99);
  console.log(
    `baseline raw grpc-js round trip, ${rtt.length} one at a time: p50=${pct(rtt, 50).toFixed(1)} p99=${rttP99.toFixed(1)} ms`,
  );
  console.log(
    `RESULT waiting_sessions=${waiting.liveSessions} waiting_kb=${kb(waitingKb)} idle_kb=${kb(idleKb)} ratio=${(waitingKb / idleKb).toFixed(2)} decision_p99_ms=${p99.toFixed(1)} burst_p99_ms=${burstP99.toFixed(1)} decisions_per_s=${rate.toFixed(0)} rtt_p99_ms=${rttP99.toFixed(1)} decision_to_rtt_p99=${(p99 / rttP99).toFixed(2)}`,
  );
} finally {
  runner.close();
  await stack.stop();
}
