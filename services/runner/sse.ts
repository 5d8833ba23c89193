// A server-sent-events decoder for model streams. The openai SDK makes the request (auth, base
// URL, timeouts, abort, errors for non-2xx answers); its body is decoded here because this loop
// runs once per token for every session on the runner, and measured about twice as fast as the
// SDK's generic stream iterator (see docs/benchmarks.md).
//
// Follows the WHATWG event-stream rules that matter for model APIs: LF, CRLF or CR line ends,
// comment lines (":"), multi-line data joined with "\n", an event ends at a blank line, and a
// final event without a trailing blank line is still delivered.

export interface SseEvent {
  event: string;
  data: string;
}

export async function* decodeSse(body: AsyncIterable<Uint8Array>): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  const take = (): SseEvent | undefined => {
    if (data.length === 0) {
      event = "";
      return undefined;
    }
    const out = { event: event || "message", data: data.join("\n") };
    event = "";
    data = [];
    return out;
  };
  const line = (text: string): SseEvent | undefined => {
    if (text === "") return take();
    if (text.charCodeAt(0) === 58 /* ":" */) return undefined;
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.charCodeAt(0) === 32 /* " " */) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") event = value;
    return undefined;
  };

  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true });
    let start = 0;
    for (;;) {
      let end = -1;
      for (let i = start; i < buffer.length; i++) {
        const c = buffer.charCodeAt(i);
        if (c === 10 || c === 13) {
          end = i;
          break;
        }
      }
      if (end < 0) break;
      // A CR at the very end may be the first half of a CRLF still in flight.
      if (buffer.charCodeAt(end) === 13 && end === buffer.length - 1) break;
      const ev = line(buffer.slice(start, end));
      start = end + (buffer.charCodeAt(end) === 13 && buffer.charCodeAt(end + 1) === 10 ? 2 : 1);
      if (ev) yield ev;
    }
    buffer = buffer.slice(start);
  }
  buffer += decoder.decode();
  if (buffer !== "") {
    for (const rest of buffer.split(/\r\n|\r|\n/)) {
      const ev = line(rest);
      if (ev) yield ev;
    }
  }
  const last = take();
  if (last) yield last;
}
