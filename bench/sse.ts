// bench/sse: the runner's SSE decoder (services/runner/providers/sse.ts), in-process. Two figures:
// - per event: chat-completions chunks as OpenAI streams them, in reads of 700 to 1,600 bytes cut
//   anywhere, so most reads end inside an event;
// - a broken stream: one `data:` line that never ends, in 64 KiB reads, until the decoder's bound
//   (16 Mi characters) stops it. The baseline, same run: the same number of bytes as ordinary
//   events, in the same reads. A stream that never ends a line should cost no more than one that
//   does; the ratio is the broken stream's time over the baseline's.
//
//   node dist/bench/sse.js [--rounds 5]
import { parseArgs } from "node:util";
import { MAX_EVENT_CHARS, SseDecoder, SseEventTooLarge } from "../services/runner/providers/sse.js";

const { values } = parseArgs({ options: { rounds: { type: "string", default: "5" } } });
const ROUNDS = Number(values.rounds);
const enc = new TextEncoder();

const chunk = (i: number) =>
  `data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":" token${i}"},"logprobs":null,"finish_reason":null}]}\n\n`;

/** `bytes` cut into reads: fixed `size`, or varying from 700 to 1,600 bytes when size is 0. */
function reads(bytes: Uint8Array, size: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let at = 0, k = 0; at < bytes.length; k++) {
    const n = size || 700 + ((k * 131) % 900);
    out.push(bytes.subarray(at, at + n));
    at += n;
  }
  return out;
}

/** Decodes every read; the events completed, or -1 when the bound stopped it. */
function decodeAll(parts: Uint8Array[]): number {
  const decoder = new SseDecoder();
  let events = 0;
  try {
    for (const p of parts) events += decoder.push(p).length;
  } catch (err) {
    if (err instanceof SseEventTooLarge) return -1;
    throw err;
  }
  return events + decoder.end().length;
}

/** The best of ROUNDS timings of f, in ms (after one round to warm up). */
function bestMs(f: () => void): number {
  let best = Number.POSITIVE_INFINITY;
  for (let round = 0; round <= ROUNDS; round++) {
    const t = performance.now();
    f();
    if (round > 0) best = Math.min(best, performance.now() - t);
  }
  return best;
}

const EVENTS = 20_000;
let text = "";
for (let i = 0; i < EVENTS; i++) text += chunk(i);
const small = reads(enc.encode(text), 0);
const perEventNs =
  (bestMs(() => {
    if (decodeAll(small) !== EVENTS) throw new Error("events lost");
  }) *
    1e6) /
  EVENTS;

// Past the bound by one read: 16 Mi characters and one 64 KiB read more.
const floodBytes = MAX_EVENT_CHARS + 65_536;
const flood = reads(enc.encode(`data: ${"z".repeat(floodBytes)}`), 65_536);
let ordinaryText = "";
for (let i = 0; ordinaryText.length < floodBytes; i++) ordinaryText += chunk(i);
const ordinary = reads(enc.encode(ordinaryText.slice(0, ordinaryText.lastIndexOf("\n\n") + 2)), 65_536);
const floodMs = bestMs(() => {
  if (decodeAll(flood) !== -1) throw new Error("the bound did not stop the line");
});
const ordinaryMs = bestMs(() => {
  if (decodeAll(ordinary) <= 0) throw new Error("no events");
});

console.log(`per event, reads cut anywhere: ${perEventNs.toFixed(0)} ns (${EVENTS} chat-completions chunks)`);
console.log(
  `one line never ending, 64 KiB reads to the bound: ${floodMs.toFixed(1)} ms; the same bytes as events (baseline): ${ordinaryMs.toFixed(1)} ms`,
);
console.log(
  `RESULT event_ns=${perEventNs.toFixed(0)} unended_line_ms=${floodMs.toFixed(1)} baseline_events_ms=${ordinaryMs.toFixed(1)} ratio=${(floodMs / ordinaryMs).toFixed(2)}`,
);
