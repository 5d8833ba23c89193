// The turn lock on its own: one run at a time, the next chosen as each ends, a resume keeping its
// turn, draining and stopping, and a rebuild's stand-in run.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { type NextRun, RunSlot } from "../../services/runner/session/run-slot.js";
import type { Queued } from "../../services/runner/session/mailbox.js";

/** A slot over a queue of named runs; each run waits until the test ends it (or it is aborted). */
function slotOver(queue: NextRun[]) {
  const log: string[] = [];
  const ending = new Map<string, () => void>();
  const slot: RunSlot = new RunSlot({
    takeNext: () => queue.shift(),
    execute: (next, signal) =>
      new Promise<void>((resolve) => {
        const name = next.resume ? `resume:${next.resume.turnId}` : next.first.map((q) => q.frameId).join("+");
        log.push(`run ${name} as ${slot.turnId}`);
        const end = () => {
          log.push(`end ${name}`);
          resolve();
        };
        ending.set(name, end);
        signal.addEventListener("abort", () => {
          log.push(`abort ${name}: ${(signal.reason as Error).message}`);
          end();
        });
      }),
    started: () => log.push("started"),
    ended: () => log.push(`ended, busy=${slot.busy}`),
    nothingOwed: () => log.push("nothing owed"),
  });
  return { slot, log, end: (name: string) => ending.get(name)?.() };
}

const batch = (...frameIds: string[]): NextRun => ({ first: frameIds.map((frameId) => ({ frameId }) as Queued) });
const settle = () => new Promise((resolve) => setImmediate(resolve));
/** The slot's log without each run's turn id (random), which the tests check on their own. */
const withoutTurns = (log: string[]) => log.map((l) => l.replace(/ as .*/, ""));

describe("the run slot", () => {
  test("runs one at a time, choosing the next as each ends, and says when nothing is owed", async () => {
    const queue = [batch("a"), batch("b", "c")];
    const { slot, log, end } = slotOver(queue);
    slot.schedule();
    const first = slot.turnId;
    slot.schedule();
    assert.equal(log.filter((l) => l.startsWith("run")).length, 1, "a second schedule while busy starts nothing");
    end("a");
    await settle();
    assert.ok(slot.busy && slot.turnId !== first, "the next run has a turn of its own");
    end("b+c");
    await settle();
    assert.equal(slot.busy, false);
    assert.deepEqual(withoutTurns(log), [
      "started",
      "run a",
      "end a",
      "ended, busy=false",
      "started",
      "run b+c",
      "end b+c",
      "ended, busy=false",
      "nothing owed",
    ]);
  });

  test("a resumed run keeps the turn it was cut off in", async () => {
    const { slot, log } = slotOver([{ first: [], resume: { turnId: "turn-7", from: 3, interrupted: [] } }]);
    slot.schedule();
    assert.equal(slot.turnId, "turn-7");
    assert.ok(log.includes("run resume:turn-7 as turn-7"));
  });

  test("draining lets the run going end and starts nothing after it", async () => {
    const queue = [batch("a"), batch("b")];
    const { slot, log, end } = slotOver(queue);
    slot.schedule();
    const drained = slot.drain();
    let done = false;
    void drained.then(() => {
      done = true;
    });
    await settle();
    assert.equal(done, false, "drain waits for the run going");
    end("a");
    await drained;
    slot.schedule();
    assert.equal(slot.busy, false);
    assert.deepEqual(queue, [batch("b")], "b is still queued, for the next runner");
    assert.ok(!log.some((l) => l.startsWith("run b")));
    assert.equal(await Promise.race([slot.drain().then(() => "resolved"), settle().then(() => "pending")]), "resolved");
  });

  test("stopping aborts the run going with the reason given and never starts another", async () => {
    const { slot, log } = slotOver([batch("a"), batch("b")]);
    slot.schedule();
    await slot.stop(new Error("runner shutting down"));
    assert.ok(slot.stopped && !slot.busy);
    slot.schedule();
    assert.deepEqual(
      withoutTurns(log),
      ["started", "run a", "abort a: runner shutting down", "end a", "ended, busy=false"],
      "b never ran, and the stopped slot did not look for more work",
    );
  });

  test("a rebuild's stand-in run carries its turn, blocks nothing after, and restores the run going", async () => {
    const { slot, end } = slotOver([batch("a")]);
    const seen: (string | undefined)[] = [];
    slot.asRun("cut-off", () => seen.push(slot.turnId));
    assert.deepEqual(seen, ["cut-off"]);
    assert.equal(slot.busy, false, "nothing is left going");
    slot.schedule();
    const going = slot.turnId;
    assert.throws(() =>
      slot.asRun("other", () => {
        throw new Error("the closing failed");
      }),
    );
    assert.equal(slot.turnId, going, "the real run is put back even when the stand-in throws");
    end("a");
  });
});
