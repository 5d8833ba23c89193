// bench/actors: how many live sessions one runner holds, what an idle one costs, and how quickly
// events flow at that load. Every session is raised through the gateway with one real turn
// against the scripted model (so its actor holds a conversation, acks and recent events), then:
//
// - idle_actor_kb: runner heap (after a GC) with N idle actors in memory, minus the heap with none,
//   per actor;
// - passivated_kb: the same after every session has been passivated (left memory; reloaded from
//   its log on next use), per session;
// - latency: prompt -> frame_accepted (ack), -> first token, -> agent_end, over turns on random
//   sessions; measured first with few live sessions (the baseline, same run) and then at N;
// - open: a Chat stream's open -> its `opened` (the session's first answer), on live sessions, and
//   after all N are passivated on cold ones (activated from the store, their log read).
//
// `--store postgres` keeps the sessions in a PostgreSQL server of its own (Debian's package)
// instead of the file store.
//
// The runner runs with --expose-gc so the heap figures follow a collection; memory lookups are off
// (TROUPE_MEMORY_CONTEXT_K=0) to measure the actors, not the memory service.
//
//   node dist/bench/actors.js [--sessions 10000] [--concurrency 64] [--turns 2000] [--store file|postgres]
import { chmod, mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { RunnerService } from "../services/shared/gen/troupe/v1/runner_pb.js";
import { ChatSession } from "../test/helpers/session.js";
import { LOAD_QUOTAS, startStack, type Stack } from "../test/helpers/stack.js";
import { startLocalPostgres } from "../services/cli/up/local-postgres.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    sessions: { type: "string", default: "10000" },
    concurrency: { type: "string", default: "64" },
    turns: { type: "string", default: "2000" },
    store: { type: "string", default: "file" },
  },
});
if (values.store !== "file" && values.store !== "postgres") throw new Error("--store is file or postgres");
const N = Number(values.sessions);
const CONCURRENCY = Number(values.concurrency);
const TURNS = Number(values.turns);
const WARM = Math.min(200, N);
const fmt = (xs: number[]) => `p50=${pct(xs, 50).toFixed(1)} p99=${pct(xs, 99).toFixed(1)} ms`;
const kb = (bytes: number) => (bytes / 1024).toFixed(2);

/** Runs `count` tasks with at most `CONCURRENCY` at a time. */
async function pool(count: number, task: (i: number) => Promise<void>, concurrency = CONCURRENCY): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, count) }, async () => {
      while (next < count) await task(next++);
    }),
  );
}

interface Turn {
  /** Open sent -> opened. */
  open: number;
  ack: number;
  firstToken: number;
  end: number;
}

/** One turn on a session over its own Chat stream: open, prompt, wait for the end. */
async function turn(stack: Stack, sessionId: string, create: boolean, text: string): Promise<Turn> {
  const s = new ChatSession(stack.gateway);
  try {
    const o0 = performance.now();
    s.open(sessionId, create);
    await s.waitOpened(30_000);
    const t0 = performance.now();
    const open = t0 - o0;
    const frameId = s.prompt(text);
    const from = s.events.length;
    await s.waitFor((e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === frameId, 30_000, from);
    const ack = performance.now() - t0;
    await s.waitFor((e) => e.payload.case === "messageUpdate", 30_000, from);
    const firstToken = performance.now() - t0;
    await s.waitFor((e) => e.payload.case === "agentEnd", 30_000, from);
    const end = performance.now() - t0;
    // Leave without a stream reset: thousands of resets on one connection would close it.
    const status = await s.finish();
    if (status.code !== 0) throw new Error(`session ${sessionId} ended with ${status.code} ${status.details}`);
    return { open, ack, firstToken, end };
  } catch (err) {
    s.close();
    throw err;
  }
}

async function latency(stack: Stack, live: number, turns: number, concurrency: number): Promise<Turn[]> {
  const out: Turn[] = [];
  await pool(
    turns,
    async (i) => void out.push(await turn(stack, `act-${Math.floor(Math.random() * live)}`, false, `again ${i}`)),
    concurrency,
  );
  return out;
}

const pgDir = values.store === "postgres" ? await mkdtemp(path.join(os.tmpdir(), "troupe-bench-actors-")) : "";
// The server runs as Debian's postgres user, which must reach its directory.
if (pgDir) await chmod(pgDir, 0o711);
const pg = pgDir ? await startLocalPostgres(path.join(pgDir, "pg")) : undefined;
const stack = await startStack({
  services: ["model-server", "router", "runner", "gateway"],
  // One tenant opens 10,000 sessions: the per-tenant limits are not what this measures.
  env: {
    ...LOAD_QUOTAS,
    TROUPE_LOG_LEVEL: "warn",
    TROUPE_MEMORY_CONTEXT_K: "0",
    NODE_OPTIONS: "--expose-gc",
    TROUPE_TENANT_RATE: "1000000",
    TROUPE_TENANT_BURST: "1000000",
    TROUPE_TENANT_STREAMS: "1000000",
    ...(pg ? { TROUPE_STORE_URL: await pg.createDatabase("actors") } : {}),
  },
});
// Passivating 100,000 sessions takes longer than a call's default deadline.
const runner = stack.client(RunnerService, stack.addr.runner, { defaultDeadlineMs: 600_000 });
const runnerPid = stack.process("runner")!.pid!;
const stats = () => runner.getRunnerStats({ collectGarbage: true });
const openFiles = async () => (await readdir(`/proc/${runnerPid}/fd`)).length;
try {
  // Warm every code path, then empty the runner: the heap with no actors is the reference.
  await pool(WARM, async (i) => void (await turn(stack, `act-${i}`, true, "hello")));
  await latency(stack, WARM, Math.min(TURNS, 500), 16); // the first pass warms the JIT
  const lowLoad = await latency(stack, WARM, Math.min(TURNS, 500), 16);
  await runner.passivateIdle({ idleForMs: 0 });
  const empty = await stats();
  if (!empty.garbageCollected) throw new Error("the runner did not collect garbage; is --expose-gc passed?");
  const fdsEmpty = await openFiles();

  const t0 = performance.now();
  await pool(N, async (i) => void (await turn(stack, `act-${i}`, i >= WARM, "hello")));
  const raiseS = (performance.now() - t0) / 1000;
  // Idle logs close their files after 2 s.
  await new Promise((r) => setTimeout(r, 3000));
  const live = await stats();
  const fdsLive = await openFiles();
  const atLoad = await latency(stack, N, TURNS, 16);
  const afterLoad = await stats();

  const p0 = performance.now();
  const { passivated } = await runner.passivateIdle({ idleForMs: 0 });
  const passivateS = (performance.now() - p0) / 1000;
  const gone = await stats();
  // Cold opens: every session passivated, so each open activates one from the store.
  const cold = await latency(stack, N, Math.min(TURNS, 1000), 16);

  const idleActor = (Number(live.heapUsedBytes) - Number(empty.heapUsedBytes)) / live.liveSessions;
  const perPassivated = Math.max(0, Number(gone.heapUsedBytes) - Number(empty.heapUsedBytes)) / N;
  console.log(
    `raised ${N} sessions (one turn each) in ${raiseS.toFixed(1)} s (${(N / raiseS).toFixed(0)} turns/s, ${CONCURRENCY} at a time)`,
  );
  console.log(
    `runner heap: ${kb(Number(empty.heapUsedBytes))} KB with no actors, ${kb(Number(live.heapUsedBytes))} KB with ${live.liveSessions} idle actors, ${kb(Number(gone.heapUsedBytes))} KB after passivating ${passivated} (in ${passivateS.toFixed(1)} s)`,
  );
  console.log(
    `runner rss: ${(Number(live.rssBytes) / 2 ** 20).toFixed(0)} MiB with ${live.liveSessions} actors; open files: ${fdsEmpty} with none, ${fdsLive} with ${live.liveSessions} idle`,
  );
  console.log(
    `idle actor: ${kb(idleActor)} KB heap each (target <= 20); passivated session: ${kb(perPassivated)} KB each`,
  );
  console.log(
    `latency with ${WARM} live sessions (baseline, ${lowLoad.length} turns): ack ${fmt(lowLoad.map((t) => t.ack))}; first token ${fmt(lowLoad.map((t) => t.firstToken))}; agent_end ${fmt(lowLoad.map((t) => t.end))}`,
  );
  console.log(
    `latency with ${live.liveSessions} live sessions (${atLoad.length} turns, 16 at a time): ack ${fmt(atLoad.map((t) => t.ack))}; first token ${fmt(atLoad.map((t) => t.firstToken))}; agent_end ${fmt(atLoad.map((t) => t.end))}`,
  );
  console.log(
    `open -> opened: ${fmt(lowLoad.map((t) => t.open))} with ${WARM} live (baseline); ${fmt(atLoad.map((t) => t.open))} with ${live.liveSessions} live; ${fmt(cold.map((t) => t.open))} on passivated sessions (${values.store} store)`,
  );
  console.log(
    `heap after the load turns: ${kb(Number(afterLoad.heapUsedBytes))} KB with ${afterLoad.liveSessions} actors`,
  );
  const ok = live.liveSessions >= 10_000 && idleActor <= 20 * 1024;
  console.log(`targets (>= 10000 live sessions, <= 20 KB per idle actor): ${ok ? "met" : "MISSED"}`);
  console.log(
    `RESULT live_sessions=${live.liveSessions} idle_actor_kb=${kb(idleActor)} p99_ms=${pct(
      atLoad.map((t) => t.firstToken),
      99,
    ).toFixed(1)} open_p99_ms=${pct(
      atLoad.map((t) => t.open),
      99,
    ).toFixed(1)} cold_open_p99_ms=${pct(
      cold.map((t) => t.open),
      99,
    ).toFixed(1)} store=${values.store}`,
  );
} finally {
  runner.close();
  await stack.stop();
  await pg?.stop();
  if (pgDir) await rm(pgDir, { recursive: true, force: true });
}
