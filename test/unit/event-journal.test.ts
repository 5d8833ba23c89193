// The event journal against a log whose synced writes land when the test says: no client sees a
// run's end before the log has it, and nothing overtakes it.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { AgentEvent } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { EventJournal, type EventSubscriber } from "../../services/runner/event-journal.js";
import type { LogRecord } from "../../services/runner/session-log.js";

function journalWithSlowSync() {
  const logged: LogRecord[] = [];
  const landings: (() => void)[] = [];
  const journal = new EventJournal({
    sessionId: "s",
    turnId: () => "t1",
    persist: (record, sync) => {
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
    readLog: async () => logged,
    published: () => undefined,
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
  journal.emit({ case: "agentStart", value: {} });
  journal.emit({ case: "agentEnd", value: {} });
  journal.emit({ case: "frameAccepted", value: { frameId: "f2" } });
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
  journal.emit({ case: "agentStart", value: {} });
  journal.emit({ case: "agentEnd", value: {} });
  await journal.attach(sub, 0);
  await tick();
  assert.deepEqual(cases(seen), ["agentStart"]);
  landings[0]();
  await tick();
  journal.emit({ case: "agentStart", value: {} });
  assert.deepEqual(
    seen.map((e) => [e.seq, e.payload.case]),
    [
      [1n, "agentStart"],
      [2n, "agentEnd"],
      [3n, "agentStart"],
    ],
  );
});
