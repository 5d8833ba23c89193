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

test("packed (an idle session's) the newest events come back whole, in order, and pushing goes on", () => {
  for (let pushed = 0; pushed <= 9; pushed++) {
    const r = new RecentEvents(5);
    for (let i = 1; i <= pushed; i++)
      r.push(
        create(AgentEventSchema, {
          sessionId: "s",
          seq: BigInt(i),
          turnId: `t${i}`,
          time: { seconds: BigInt(1_700_000_000 + i), nanos: i },
          payload: { case: "messageEnd", value: { message: { text: `said ${i} ✓` } } },
        }),
      );
    const before = [...r].slice(-3);
    r.pack(3);
    assert.equal(r.length, Math.min(3, pushed), `length packed after ${pushed}`);
    const after = [...r];
    assert.deepEqual(after, before, `the same events, field for field, after ${pushed}`);
    assert.equal(Number(r.oldest()?.seq ?? 0), pushed === 0 ? 0 : Math.max(1, pushed - 2));
    r.pack(3);
    r.push(ev(pushed + 1));
    assert.deepEqual(seqs(r), range(Math.max(1, pushed - 2), pushed + 1), `pushed after ${pushed}`);
  }
});

test("packing again keeps the packed ones and adds the new ones; a full buffer unpacks and goes on", () => {
  const r = new RecentEvents(6);
  for (let i = 1; i <= 3; i++) r.push(ev(i));
  r.pack(4);
  for (let i = 4; i <= 5; i++) r.push(ev(i));
  assert.deepEqual(seqs(r), [1, 2, 3, 4, 5]);
  assert.equal(Number(r.oldest()?.seq), 1);
  r.pack(4);
  assert.deepEqual(seqs(r), [2, 3, 4, 5], "the oldest packed one dropped");
  r.push(ev(6));
  r.pack(2);
  assert.deepEqual(seqs(r), [5, 6], "packed ones and a new one dropped together");
  for (let i = 7; i <= 12; i++) r.push(ev(i));
  assert.deepEqual(seqs(r), [7, 8, 9, 10, 11, 12], "past capacity the packed go first");
  r.pack(6);
  r.trim(3);
  assert.deepEqual(seqs(r), [10, 11, 12]);
  assert.equal(r.length, 3);
});
