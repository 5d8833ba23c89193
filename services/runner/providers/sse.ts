// A server-sent-events decoder for model streams. provider-post.ts makes the request (auth, base
// URL, errors for non-2xx answers) over the provider's pool (pool-fetch.ts); the body is decoded
// here because this loop runs once per token for every session on the runner, and measured about
// twice as fast as the OpenAI SDK's generic stream iterator (see bench/history.md). It is
// synchronous: bytes in, complete events out, so a network read costs one await however many
// events it carries. An event may gather at most MAX_EVENT_CHARS before it ends.
//
// Follows the WHATWG event-stream rules that matter for model APIs: LF, CRLF or CR line ends,
// comment lines (":"), multi-line data joined with "\n", an event ends at a blank line, and a
// final event without a trailing blank line is still delivered by end().

export interface SseEvent {
  event: string;
  data: string;
}

/**
 * The most characters one event may gather before its blank line (16 Mi). The largest events
 * model APIs send are whole responses (Responses' `response.completed`): a reply of 128K tokens is
 * about half a megabyte. A stream that goes past this without ending its event is broken, and
 * reading on would hold all of it in the runner's memory, beside every other session's.
 */
export const MAX_EVENT_CHARS = 16 * 1024 * 1024;

/** An event grew past the decoder's bound without ending; nothing more is read from the stream. */
export class SseEventTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`the model stream sent an event of more than ${limit} characters without ending it`);
    this.name = "SseEventTooLarge";
  }
}

export class SseDecoder {
  private readonly decoder = new TextDecoder();
  private buffer = "";
  private event = "";
  private data: string[] = [];
  /** Characters of the event being gathered, in `data` (the unended line is in `buffer`). */
  private dataChars = 0;
  /** How much of `buffer`'s start is known to hold no line end. */
  private unscanned = 0;
  /**
   * Reads with no line end that came after `buffer`, kept apart until one does: appending each to
   * `buffer` would copy the whole unended line again on every read (the search flattens it).
   */
  private held: string[] = [];
  private heldChars = 0;

  constructor(private readonly maxEventChars = MAX_EVENT_CHARS) {}

  /** Decodes one network read; returns the events it completed. Throws SseEventTooLarge. */
  push(bytes: Uint8Array): SseEvent[] {
    const text = this.decoder.decode(bytes, { stream: true });
    // Held only after a line that is already going and does not end in a CR (which may be
    // half a CRLF, and is read as a line end once the next character is known).
    if (this.buffer !== "" && this.buffer.charCodeAt(this.buffer.length - 1) !== 13 && !hasLineEnd(text)) {
      this.held.push(text);
      this.heldChars += text.length;
      this.checkBound();
      return [];
    }
    this.append(text);
    const out = this.lines(false);
    this.checkBound();
    return out;
  }

  /** The body ended: whatever is left forms the last event. */
  end(): SseEvent[] {
    this.append(this.decoder.decode());
    const out = this.lines(true);
    const last = this.take();
    if (last) out.push(last);
    return out;
  }

  /** `text` after the buffer and what is held (which holds no line end, so needs no search). */
  private append(text: string): void {
    if (this.held.length > 0) {
      this.buffer += this.held.join("");
      this.unscanned = this.buffer.length;
      this.held = [];
      this.heldChars = 0;
    }
    this.buffer += text;
  }

  private checkBound(): void {
    if (this.dataChars + this.buffer.length + this.heldChars > this.maxEventChars)
      throw new SseEventTooLarge(this.maxEventChars);
  }

  private lines(final: boolean): SseEvent[] {
    const out: SseEvent[] = [];
    const buf = this.buffer;
    let start = 0;
    // Where to look for the next line end: what earlier reads left holds none, so a long line
    // arriving in many reads is searched once, not once per read.
    let from = this.unscanned;
    for (;;) {
      const lf = buf.indexOf("\n", from);
      const cr = buf.indexOf("\r", from);
      const end = cr < 0 ? lf : lf < 0 ? cr : Math.min(cr, lf);
      if (end < 0) {
        from = buf.length;
        break;
      }
      // A CR at the very end may be the first half of a CRLF still in flight.
      if (end === cr && end === buf.length - 1 && !final) {
        from = end;
        break;
      }
      const ev = this.line(buf.slice(start, end));
      if (ev) out.push(ev);
      start = end + (end === cr && buf.charCodeAt(end + 1) === 10 ? 2 : 1);
      from = start;
    }
    this.buffer = buf.slice(start);
    this.unscanned = from - start;
    if (final && this.buffer !== "") {
      const ev = this.line(this.buffer);
      if (ev) out.push(ev);
      this.buffer = "";
      this.unscanned = 0;
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
    if (field === "data") {
      this.data.push(value);
      this.dataChars += value.length;
    } else if (field === "event") this.event = value;
    return undefined;
  }

  private take(): SseEvent | undefined {
    this.dataChars = 0;
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

function hasLineEnd(text: string): boolean {
  return text.indexOf("\n") >= 0 || text.indexOf("\r") >= 0;
}
