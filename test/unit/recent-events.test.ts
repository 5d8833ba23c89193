// The recent-events buffer: the newest `capacity` events, oldest first, through wraps and trims.
import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { type AgentEvent, AgentEventSchema } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { RecentEvents } from "../../services/runner/session/recent-events.js";

const ev = (seq: number): AgentEvent => create(AgentEventSchema, { sessionId: "s", seq: BigInt(seq) });
const seqs = (r: RecentEvents) => [...r].map((e) => Number(e.seq));
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

test("holds every event until full, then the newest capacity of them, oldest first", () => {
  const r = new RecentEvents(5);
  assert.equal(r.length, 0);
  assert.equal(r.oldest(), undefined);
  assert.deepEqual(seqs(r), []);
  for (let i = 1; i <= 3; i++) r.push(ev(i));
  assert.deepEqual(seqs(r), [1, 2, 3]);
  for (let i = 4; i <= 12; i++) {
    r.push(ev(i));
    assert.deepEqual(seqs(r), range(Math.max(1, i - 4), i), `after ${i}`);
    assert.equal(Number(r.oldest()?.seq), Math.max(1, i - 4));
    assert.equal(r.length, Math.min(5, i));
  }
});

test("a trim keeps the newest, in order, wherever the oldest was; pushing goes on from there", () => {
  for (let pushed = 0; pushed <= 14; pushed++) {
    const r = new RecentEvents(5);
    for (let i = 1; i <= pushed; i++) r.push(ev(i));
    r.trim(2);
    const kept = range(Math.max(1, pushed - 1), pushed);
    assert.deepEqual(seqs(r), kept, `trimmed after ${pushed}`);
    for (let i = pushed + 1; i <= pushed + 7; i++) r.push(ev(i));
    assert.deepEqual(seqs(r), range(pushed + 3, pushed + 7), `refilled after ${pushed}`);
  }
  const r = new RecentEvents(3);
  r.push(ev(1));
  r.trim(0);
  assert.deepEqual(seqs(r), []);
  assert.throws(() => new RecentEvents(0), RangeError);
});
