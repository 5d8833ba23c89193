// The model-stream SSE decoder, fed byte sequences split the ways a network splits them.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { SseDecoder, SseEventTooLarge, type SseEvent } from "../../services/runner/providers/sse.js";

async function decode(parts: (string | Uint8Array)[]): Promise<SseEvent[]> {
  const enc = new TextEncoder();
  const decoder = new SseDecoder();
  const out: SseEvent[] = [];
  for (const p of parts) out.push(...decoder.push(typeof p === "string" ? enc.encode(p) : p));
  out.push(...decoder.end());
  return out;
}

describe("decodeSse", () => {
  test("events end at a blank line; LF, CRLF and CR all end lines", async () => {
    const expected = [
      { event: "message", data: "a" },
      { event: "message", data: "b" },
    ];
    assert.deepEqual(await decode(["data: a\n\ndata: b\n\n"]), expected);
    assert.deepEqual(await decode(["data: a\r\n\r\ndata: b\r\n\r\n"]), expected);
    assert.deepEqual(await decode(["data: a\r\rdata: b\r\r"]), expected);
  });

  // A read with no line end after a line already going is held apart (sse.ts); three reads cut
  // anywhere (two when the middle one is empty) cover a line held, then ended by a LF, a CRLF
  // split in two or not, or a lone CR.
  test("any split into two or three reads gives the same events, with LF, CRLF or CR line ends", async () => {
    for (const nl of ["\n", "\r\n", "\r"]) {
      const text = `data: {"a":1}${nl}${nl}event: e${nl}data: two${nl}data: lines${nl}${nl}: c${nl}data: z${nl}${nl}`;
      const whole = await decode([text]);
      assert.deepEqual(whole, [
        { event: "message", data: '{"a":1}' },
        { event: "e", data: "two\nlines" },
        { event: "message", data: "z" },
      ]);
      for (let a = 1; a < text.length; a++)
        for (let b = a; b < text.length; b++)
          assert.deepEqual(
            await decode([text.slice(0, a), text.slice(a, b), text.slice(b)]),
            whole,
            `${JSON.stringify(nl)} cut at ${a}, ${b}`,
          );
      assert.deepEqual(await decode(text.split("")), whole, `${JSON.stringify(nl)} one character at a time`);
    }
  });

  test("a multi-byte character split across reads is decoded whole", async () => {
    const bytes = new TextEncoder().encode("data: héllo 🎭\n\n");
    const out = await decode([bytes.slice(0, 8), bytes.slice(8, 14), bytes.slice(14)]);
    assert.deepEqual(out, [{ event: "message", data: "héllo 🎭" }]);
  });

  test("multi-line data is joined with newlines; comments and unknown fields are ignored", async () => {
    assert.deepEqual(await decode(["data: one\ndata: two\nid: 7\nretry: 10\n: note\ndata:three\n\n"]), [
      { event: "message", data: "one\ntwo\nthree" },
    ]);
  });

  test("a last event without its blank line is still delivered; empty events are not", async () => {
    assert.deepEqual(await decode(["\n\n\ndata: tail"]), [{ event: "message", data: "tail" }]);
    assert.deepEqual(await decode(["event: ping\n\n"]), []);
  });

  test("an event may gather up to its bound, and each event starts from nothing", () => {
    const enc = new TextEncoder();
    const decoder = new SseDecoder(100);
    const fifty = "x".repeat(50);
    // Two lines of 50 make one event of 100 characters: at the bound, not past it.
    assert.deepEqual(decoder.push(enc.encode(`data:${fifty}\ndata:${fifty}\n\n`)), [
      { event: "message", data: `${fifty}\n${fifty}` },
    ]);
    for (let i = 0; i < 50; i++) assert.equal(decoder.push(enc.encode(`data: ${"y".repeat(90)}\n\n`)).length, 1);
  });

  test("past the bound it throws, whether one line never ends or data lines never end the event", () => {
    const enc = new TextEncoder();
    const line = new SseDecoder(100);
    line.push(enc.encode(`data: ${"x".repeat(60)}`));
    assert.throws(
      () => line.push(enc.encode("x".repeat(60))),
      (e) => e instanceof SseEventTooLarge && e.limit === 100,
    );
    const lines = new SseDecoder(100);
    for (let i = 0; i < 3; i++) lines.push(enc.encode(`data: ${"x".repeat(30)}\n`));
    assert.throws(() => lines.push(enc.encode(`data: ${"x".repeat(30)}\n`)), SseEventTooLarge);
    // Comments are dropped line by line and do not count.
    const comments = new SseDecoder(100);
    for (let i = 0; i < 10; i++) comments.push(enc.encode(`: ${"c".repeat(60)}\n`));
    assert.deepEqual(comments.push(enc.encode("data: ok\n\n")), [{ event: "message", data: "ok" }]);
  });

  test("a long line arriving in many reads is decoded whole", () => {
    const enc = new TextEncoder();
    const decoder = new SseDecoder();
    const long = "z".repeat(1024 * 1024);
    const out: SseEvent[] = [];
    out.push(...decoder.push(enc.encode("data: ")));
    for (let at = 0; at < long.length; at += 1000) out.push(...decoder.push(enc.encode(long.slice(at, at + 1000))));
    out.push(...decoder.push(enc.encode("\r")), ...decoder.push(enc.encode("\n\r\n")));
    assert.deepEqual(out, [{ event: "message", data: long }]);
  });
});
