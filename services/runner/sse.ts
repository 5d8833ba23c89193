// A server-sent-events decoder for model streams. The openai SDK makes the request (auth, base
// URL, timeouts, abort, errors for non-2xx answers); its body is decoded here because this loop
// runs once per token for every session on the runner, and measured about twice as fast as the
// SDK's generic stream iterator (see docs/benchmarks.md). It is synchronous: bytes in, complete
// events out, so a network read costs one await however many events it carries.
//
// Follows the WHATWG event-stream rules that matter for model APIs: LF, CRLF or CR line ends,
// comment lines (":"), multi-line data joined with "\n", an event ends at a blank line, and a
// final event without a trailing blank line is still delivered by end().

export interface SseEvent {
  event: string;
  data: string;
}

export class SseDecoder {
  private readonly decoder = new TextDecoder();
  private buffer = "";
  private event = "";
  private data: string[] = [];

  /** Decodes one network read; returns the events it completed. */
  push(bytes: Uint8Array): SseEvent[] {
    this.buffer += this.decoder.decode(bytes, { stream: true });
    return this.lines(false);
  }

  /** The body ended: whatever is left forms the last event. */
  end(): SseEvent[] {
    this.buffer += this.decoder.decode();
    const out = this.lines(true);
    const last = this.take();
    if (last) out.push(last);
    return out;
  }

  private lines(final: boolean): SseEvent[] {
    const out: SseEvent[] = [];
    const buf = this.buffer;
    let start = 0;
    for (;;) {
      const lf = buf.indexOf("\n", start);
      const cr = buf.indexOf("\r", start);
      const end = cr < 0 ? lf : lf < 0 ? cr : Math.min(cr, lf);
      if (end < 0) break;
      // A CR at the very end may be the first half of a CRLF still in flight.
      if (end === cr && end === buf.length - 1 && !final) break;
      const ev = this.line(buf.slice(start, end));
      if (ev) out.push(ev);
      start = end + (end === cr && buf.charCodeAt(end + 1) === 10 ? 2 : 1);
    }
    this.buffer = buf.slice(start);
    if (final && this.buffer !== "") {
      const ev = this.line(this.buffer);
      if (ev) out.push(ev);
      this.buffer = "";
    }
    return out;
  }

  private line(text: string): SseEvent | undefined {
    if (text === "") return this.take();
    if (text.charCodeAt(0) === 58 /* ":" */) return undefined;
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.charCodeAt(0) === 32 /* " " */) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    return undefined;
  }

  private take(): SseEvent | undefined {
    if (this.data.length === 0) {
      this.event = "";
      return undefined;
    }
    const out = { event: this.event || "message", data: this.data.length === 1 ? this.data[0] : this.data.join("\n") };
    this.event = "";
    this.data = [];
    return out;
  }
}
