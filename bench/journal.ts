// bench/journal: what a session's event journal costs per event once its ring of recent events
// (4,096, kept for clients that resume) is full, as in a long turn, against the same journal while
// the ring is not yet full, in the same run. A turn that streams thousands of events (a long
// answer, an agent working through many tool calls) pays the full-ring figure on every event past
// the 4,096th.
//
// Each event goes through EventJournal as a run sends it (a delta, flushed as its own event) to one
// subscriber, with a log that takes records at once. Before the timed events the ring is filled
// (for the full case) and two collections run, as a busy runner's young collections (about one a
// second under bench/stream's paced load) would have run by then: they move the ring to the old
// generation, where what an array costs to trim differs (recent-events.ts). Rounds alternate the
// two cases; figures are medians. RESULT: full_us, filling_us (µs per event), ratio = full / filling.
//
//   node dist/bench/journal.js [--events 3000] [--rounds 9]
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { parseArgs } from "node:util";
import { EventJournal, RING_SIZE as RING } from "../services/runner/session/event-journal.js";
import { median } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    events: { type: "string", default: "3000" },
    rounds: { type: "string", default: "9" },
  },
});
const EVENTS = Number(values.events);
const ROUNDS = Number(values.rounds);
if (EVENTS + 1 > RING)
  throw new Error(`--events must stay under the ring's ${RING}, so the filling case never fills it`);
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

/** µs per event for EVENTS events, after `before` events and two collections, in a new session. */
function timed(before: number): number {
  let received = 0;
  const journal = new EventJournal("bench", { append: () => Promise.resolve(), read: async () => [] });
  void journal.attach({ send: () => void received++, pressure: () => undefined, close: () => undefined });
  const stream = (n: number) => {
    for (let i = 0; i < n; i++) {
      journal.delta("m", "text", "token ", "t");
      journal.flushDelta();
    }
  };
  stream(before);
  gc();
  gc();
  const t0 = performance.now();
  stream(EVENTS);
  const us = ((performance.now() - t0) * 1000) / EVENTS;
  if (received !== before + EVENTS) throw new Error(`the subscriber got ${received} of ${before + EVENTS} events`);
  return us;
}

// Warm-up: the JIT has seen both cases before anything is timed.
for (let i = 0; i < 3; i++) timed(0), timed(RING);
const filling: number[] = [];
const full: number[] = [];
for (let i = 0; i < ROUNDS; i++) {
  filling.push(timed(0));
  full.push(timed(RING));
}
const list = (xs: number[]) => xs.map((x) => x.toFixed(2)).join(", ");
const [f, u] = [median(filling), median(full)];
console.log(`ring filling (events 1 to ${EVENTS}): ${f.toFixed(2)} µs per event   [${list(filling)}]`);
console.log(`ring full (events ${RING + 1} to ${RING + EVENTS}): ${u.toFixed(2)} µs per event   [${list(full)}]`);
console.log(`RESULT full_us=${u.toFixed(2)} filling_us=${f.toFixed(2)} ratio=${(u / f).toFixed(2)}`);
