// The turn lock on its own: one run at a time, a run keeping the turn it is given, draining and
// stopping, and a rebuild's stand-in run. Which run starts when is the actor's (session-actor.test).
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { RunSlot } from "../../services/runner/session/run-slot.js";

const settle = () => new Promise((resolve) => setImmediate(resolve));

/** A run in `slot` that goes until `end` (or its abort); what it saw is in `log`. */
function runIn(slot: RunSlot, turnId: string, log: string[]) {
  const signal = slot.take(turnId);
  let end!: () => void;
  const done = new Promise<void>((resolve) => {
    end = () => {
      log.push(`end ${turnId}`);
      slot.release();
      resolve();
    };
    signal.addEventListener("abort", () => {
      log.push(`abort ${turnId}: ${(signal.reason as Error).message}`);
      end();
    });
  });
  slot.runs(done);
  return { signal, end, done };
}

describe("the run slot", () => {
  test("holds one run at a time, under the turn it was given, and opens when it is released", () => {
    const slot = new RunSlot();
    const log: string[] = [];
    assert.ok(slot.open && !slot.busy);
    const a = runIn(slot, "turn-7", log);
    assert.equal(slot.turnId, "turn-7", "a resumed run keeps the turn it was cut off in");
    assert.ok(slot.busy && !slot.open);
    assert.throws(() => slot.take("other"), /not open/, "a second run is refused while one is going");
    a.end();
    assert.ok(slot.open && !slot.busy && slot.turnId === undefined);
    assert.deepEqual(log, ["end turn-7"]);
  });

  test("draining lets the run going end and opens for nothing after it", async () => {
    const slot = new RunSlot();
    const log: string[] = [];
    const a = runIn(slot, "a", log);
    const drained = slot.drain();
    let done = false;
    void drained.then(() => {
      done = true;
    });
    await settle();
    assert.equal(done, false, "drain waits for the run going");
    a.end();
    await drained;
    assert.equal(slot.busy, false);
    assert.equal(slot.open, false, "nothing starts after a drain");
    assert.throws(() => slot.take("b"), /not open/);
    assert.equal(await Promise.race([slot.drain().then(() => "resolved"), settle().then(() => "pending")]), "resolved");
  });

  test("stopping aborts the run going with the reason given and never opens again", async () => {
    const slot = new RunSlot();
    const log: string[] = [];
    runIn(slot, "a", log);
    await slot.stop(new Error("runner shutting down"));
    assert.ok(slot.stopped && !slot.busy && !slot.open);
    assert.deepEqual(log, ["abort a: runner shutting down", "end a"]);
  });

  test("a rebuild's stand-in run carries its turn, blocks nothing after, and restores the run going", () => {
    const slot = new RunSlot();
    const seen: (string | undefined)[] = [];
    slot.asRun("cut-off", () => seen.push(slot.turnId));
    assert.deepEqual(seen, ["cut-off"]);
    assert.ok(!slot.busy && slot.open, "nothing is left going");
    const a = runIn(slot, "a", []);
    assert.throws(() =>
      slot.asRun("other", () => {
        throw new Error("the closing failed");
      }),
    );
    assert.equal(slot.turnId, "a", "the real run is put back even when the stand-in throws");
    a.end();
  });
});
