// The event journal against a log whose synced writes land when the test says: no client sees a
// run's end before the log has it, and nothing overtakes it.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { AgentEvent } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { EventJournal, type EventSubscriber } from "../../services/runner/session/event-journal.js";
import type { LogRecord } from "../../services/runner/session/session-log.js";

function journalWithSlowSync() {
  const logged: LogRecord[] = [];
  const landings: (() => void)[] = [];
  const journal = new EventJournal("s", {
    append: (record, sync) => {
      if (!sync || record.t === "seq") {
        logged.push(record);
        return Promise.resolve();
      }
      return new Promise<void>((land) =>
        landings.push(() => {
          logged.push(record);
          land();
        }),
      );
    },
    read: async () => logged,
  });
  const seen: AgentEvent[] = [];
  const sub: EventSubscriber = { send: (e) => void seen.push(e), pressure: () => undefined, close: () => undefined };
  return { journal, sub, seen, logged, landings };
}

const cases = (events: AgentEvent[]) => events.map((e) => e.payload.case);
const tick = () => new Promise((r) => setImmediate(r));

test("a run's end reaches subscribers only once it is durable, and later events wait behind it", async () => {
  const { journal, sub, seen, logged, landings } = journalWithSlowSync();
  await journal.attach(sub);
  journal.emit({ case: "agentStart", value: {} }, "t1");
  journal.emit({ case: "agentEnd", value: {} }, "t1");
  journal.emit({ case: "frameAccepted", value: { frameId: "f2" } }, "t1");
  await tick();
  assert.deepEqual(cases(seen), ["agentStart"], "the end and what follows it are held");
  assert.equal(journal.lastSeq, 3, "numbering is not held up");
  assert.equal(landings.length, 1);
  landings[0]();
  await tick();
  assert.deepEqual(cases(seen), ["agentStart", "agentEnd", "frameAccepted"]);
  assert.deepEqual(
    seen.map((e) => e.seq),
    [1n, 2n, 3n],
  );
  assert.ok(
    logged.some((r) => r.t === "event" && (r.event as { agentEnd?: unknown }).agentEnd !== undefined),
    "the end was in the log before anyone saw it",
  );
});

test("a client attaching while an end is held gets it once, in order, after it lands", async () => {
  const { journal, sub, seen, landings } = journalWithSlowSync();
  journal.emit({ case: "agentStart", value: {} }, "t1");
  journal.emit({ case: "agentEnd", value: {} }, "t1");
  await journal.attach(sub, 0);
  await tick();
  assert.deepEqual(cases(seen), ["agentStart"]);
  landings[0]();
  await tick();
  journal.emit({ case: "agentStart", value: {} }, "t1");
  assert.deepEqual(
    seen.map((e) => [e.seq, e.payload.case]),
    [
      [1n, "agentStart"],
      [2n, "agentEnd"],
      [3n, "agentStart"],
    ],
  );
});

test("a client resuming after a turn that filled the ring gets the deltas the ring holds, then a gap", async () => {
  const { journal, sub, seen } = journalWithSlowSync();
  // 5,000 deltas, each its own event (a flush after each): more than the ring's 4,096.
  for (let i = 1; i <= 5000; i++) {
    journal.delta("m1", "text", `t${i} `, "t1");
    journal.flushDelta();
  }
  journal.emit({ case: "agentStart", value: {} }, "t1");
  await journal.attach(sub, 4000);
  const seqs = seen.map((e) => Number(e.seq));
  assert.deepEqual(seqs.slice(0, 5), [4001, 4002, 4003, 4004, 4005], "from the ring, oldest first");
  assert.equal(seqs.at(-1), 5001);
  assert.equal(seen.length, 1001, "each held event once");
  const text = (e: AgentEvent) =>
    e.payload.case === "messageUpdate" && e.payload.value.delta.case === "text" ? e.payload.value.delta.value : "";
  assert.equal(text(seen[0]), "t4001 ");

  // From before the ring's oldest (seq 906): the log holds no deltas, so the client is told.
  const early: AgentEvent[] = [];
  await journal.attach({ send: (e) => void early.push(e), pressure: () => undefined, close: () => undefined }, 10);
  assert.equal(early[0].payload.case, "gap");
  assert.equal(early[0].payload.value && (early[0].payload.value as { firstSeq: bigint }).firstSeq, 11n);
  assert.equal(Number(early[1].seq), 5001 - 4096 + 1, "then the ring's oldest");
  assert.equal(Number(early.at(-1)!.seq), 5001);
});
