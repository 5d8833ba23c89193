// bench/cluster: what a runner's death costs on the PostgreSQL store, and what the store costs.
//
// 1. Append throughput, in this process: S sessions each append R records of an event's size
//    (every 10th synced, as a frame is; the others not, as events are), through the PostgreSQL
//    store (group commit across sessions) and through the file store (the baseline: per-session
//    group commit and fsync), on the same machine in the same run.
// 2. Failover, through real processes: 3 runners on one PostgreSQL, N live sessions on each
//    (CreateSession through the gateway). One runner is SIGKILLed; at that instant a client per
//    session of the dead runner starts resuming (Chat open with create=false and replay after its
//    last seq, then a prompt, retrying every 100 ms as real clients do) and the time to that
//    prompt's acknowledgement is its failover time. The same resume on live runners' sessions,
//    measured first, is the baseline. Takeover waits for the dead runner's lease to lapse
//    (TROUPE_RUNNER_LIVENESS_MS, given here), so that bound is printed beside the figures.
//    The baseline's own duration is the floor: the victims' resumes are as much work as the
//    baseline's, on the same cores, however fast the takeover; "opened" is when the session
//    answered its open (activated elsewhere, its log read), before the prompt.
//
//   node dist/bench/cluster.js [--sessions 2000] [--liveness-ms 3000] [--concurrency 256]
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { placeOn } from "../services/router/server.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { refKey, refOf } from "../services/shared/session-ref.js";
import { fileStorage, pgStorage, type RunnerStorage } from "../services/runner/store/storage.js";
import { startLocalPostgres } from "../services/cli/up/local-postgres.js";
import { ChatSession } from "../test/helpers/session.js";
import { LOAD_QUOTAS, startStack, type Stack } from "../test/helpers/stack.js";
import { pct } from "./support/stats.js";
import { exitProcess } from "../services/shared/process/exit.js";

const { values } = parseArgs({
  options: {
    sessions: { type: "string", default: "2000" },
    "liveness-ms": { type: "string", default: "3000" },
    concurrency: { type: "string", default: "256" },
    "append-sessions": { type: "string", default: "200" },
    "append-records": { type: "string", default: "200" },
  },
});
const PER_RUNNER = Number(values.sessions);
const LIVENESS_MS = Number(values["liveness-ms"]);
const CONCURRENCY = Number(values.concurrency);
const fmt = (xs: number[]) => `p50=${pct(xs, 50).toFixed(0)} p99=${pct(xs, 99).toFixed(0)} ms`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function pool(count: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(CONCURRENCY, count) }, async () => {
      while (next < count) await task(next++);
    }),
  );
}

/** Records per second through `storage`: S sessions appending R records each, all at once. */
async function appendRate(storage: RunnerStorage, tag: string): Promise<number> {
  const S = Number(values["append-sessions"]);
  const R = Number(values["append-records"]);
  const owner = { tenant: "bench", principal: tag };
  const logs = await Promise.all(
    Array.from({ length: S }, (_, i) => storage.sessions.create(refOf(owner, `a${i}`), "main", owner)),
  );
  // An event's size: a complete assistant message of a few hundred characters.
  const event = { messageEnd: { message: { role: "ROLE_ASSISTANT", text: "lorem ipsum ".repeat(30) } } };
  const t0 = performance.now();
  await Promise.all(
    logs.map(async (log, i) => {
      const pending: Promise<void>[] = [];
      for (let n = 0; n < R; n++)
        pending.push(log.append({ t: "event", event: { ...event, seq: String(n), sessionId: `a${i}` } }, n % 10 === 9));
      await Promise.all(pending);
    }),
  );
  const rate = (S * R) / ((performance.now() - t0) / 1000);
  await Promise.all(logs.map((l) => l.close()));
  return rate;
}

/**
 * Opens the session again through the gateway and sends a prompt; resolves at its
 * acknowledgement, with when the open that succeeded was answered (the session served again:
 * activated, its log read).
 */
async function resume(stack: Stack, sessionId: string, deadline: number): Promise<{ openedAt: number }> {
  for (;;) {
    const s = new ChatSession(stack.gateway);
    try {
      s.send({ case: "open", value: { sessionId, create: false, replayAfterSeq: 0n } });
      await s.waitOpened(10_000);
      const openedAt = performance.now();
      const id = s.prompt("!tokens 1");
      await s.waitFor((e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === id, 10_000);
      return { openedAt };
    } catch (err) {
      if (performance.now() > deadline) throw err;
      await sleep(100);
    } finally {
      s.close();
    }
  }
}

async function main(): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-bench-cluster-"));
  const { chmod } = await import("node:fs/promises");
  await chmod(dir, 0o711);
  const pg = await startLocalPostgres(path.join(dir, "pg"));
  try {
    // 1. Appends: PostgreSQL against the file store.
    const self = { runnerId: "bench", address: "", incarnation: "bench" };
    const files = fileStorage(path.join(dir, "files"), self, 10_000, () => undefined);
    await files.start();
    const fileRate = await appendRate(files, "files");
    await files.stop();
    const store = pgStorage(await pg.createDatabase("appends"), self, 10_000, () => undefined);
    await store.start();
    const pgRate = await appendRate(store, "pg");
    const { batches, records } = store.sessions.appender.stats;
    await store.stop();
    console.log(
      `appends: postgres ${pgRate.toFixed(0)} records/s (${(records / batches).toFixed(1)} per statement), file store ${fileRate.toFixed(0)} records/s`,
    );

    // 2. Failover through real processes.
    const stack = await startStack({
      env: {
        ...LOAD_QUOTAS,
        TROUPE_LOG_LEVEL: "error",
        TROUPE_MEMORY_CONTEXT_K: "0",
        TROUPE_TENANT_RATE: "1000000",
        TROUPE_TENANT_BURST: "1000000",
        TROUPE_STORE_URL: await pg.createDatabase("cluster"),
        TROUPE_RUNNER_LIVENESS_MS: String(LIVENESS_MS),
        TROUPE_RUNNER_ID: "runner-1",
      },
      services: ["model-server", "router", "runner", "gateway"],
    });
    try {
      for (const id of ["runner-2", "runner-3"]) await stack.startInstance(id, "runner", { args: ["--runner-id", id] });
      const router = stack.client(RouterService, stack.addr.router);
      for (let i = 0; i < 100 && (await router.listRunners({})).runners.length < 3; i++) await sleep(100);
      const live = (await router.listRunners({})).runners;
      router.close();
      const total = PER_RUNNER * 3;
      const ids = Array.from({ length: total }, (_, i) => `c${i}`);
      const t0 = performance.now();
      await pool(total, async (i) => void (await stack.gateway.createSession({ sessionId: ids[i] })));
      console.log(
        `${total} live sessions on 3 runners in ${((performance.now() - t0) / 1000).toFixed(1)} s (${live.map((r) => r.runnerId).join(", ")})`,
      );
      const on = (id: string) => placeOn(live, refKey(refOf(DEV_IDENTITY, id)))?.runnerId;
      const victims = ids.filter((id) => on(id) === "runner-2");
      const others = ids.filter((id) => on(id) !== "runner-2").slice(0, victims.length);

      // Baseline: the same resume on sessions whose runner is alive.
      const baseline: number[] = [];
      const baselineOpen: number[] = [];
      const b0 = performance.now();
      await pool(others.length, async (i) => {
        const start = performance.now();
        const { openedAt } = await resume(stack, others[i], start + 60_000);
        baseline.push(performance.now() - start);
        baselineOpen.push(openedAt - start);
      });
      const baselineMs = performance.now() - b0;

      await stack.kill("runner-2", "SIGKILL");
      const killed = performance.now();
      const failover: number[] = [];
      const reopened: number[] = [];
      const served: number[] = [];
      // Every victim's client starts at the kill, as clients whose streams broke would.
      let next = 0;
      await Promise.all(
        Array.from({ length: Math.min(CONCURRENCY, victims.length) }, async () => {
          while (next < victims.length) {
            const id = victims[next++];
            const { openedAt } = await resume(stack, id, killed + 120_000);
            reopened.push(openedAt - killed);
            const at = performance.now();
            served.push(at);
            failover.push(at - killed);
          }
        }),
      );
      served.sort((a, b) => a - b);
      const movedPerS = victims.length / ((served.at(-1)! - served[0]) / 1000 || 1);
      console.log(
        `resume on a live runner (baseline): ${fmt(baseline)} over ${baseline.length} sessions (opened ${fmt(baselineOpen)}), all in ${baselineMs.toFixed(0)} ms (${(baseline.length / (baselineMs / 1000)).toFixed(0)} sessions/s)`,
      );
      console.log(
        `failover of ${victims.length} sessions after SIGKILL: ${fmt(failover)} (opened ${fmt(reopened)}); first served ${(served[0] - killed).toFixed(0)} ms after the kill (lease ${LIVENESS_MS} ms); ${movedPerS.toFixed(0)} sessions/s moved after that`,
      );
      console.log(
        `RESULT failover_p99_ms=${pct(failover, 99).toFixed(0)} after_lease_p99_ms=${(pct(failover, 99) - LIVENESS_MS).toFixed(0)} reopened_p99_ms=${pct(reopened, 99).toFixed(0)} baseline_all_ms=${baselineMs.toFixed(0)} moved_per_s=${movedPerS.toFixed(0)} pg_vs_file_append=${(pgRate / fileRate).toFixed(2)} baseline_resume_p99_ms=${pct(baseline, 99).toFixed(0)} file_append_per_s=${fileRate.toFixed(0)} pg_append_per_s=${pgRate.toFixed(0)} lease_ms=${LIVENESS_MS}`,
      );
    } finally {
      await stack.stop();
    }
  } finally {
    await pg.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  void exitProcess(1);
});
