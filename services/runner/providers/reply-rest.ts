// Reading a streamed model reply up to its final event without giving up its connection.
//
// A reply's final event ([DONE], message_stop, response.completed) can come before the end of its
// HTTP body: the last piece of a chunked body goes out when the server, or a proxy on the way,
// ends the response, and it often arrives in a read of its own. Stopping at the final event then
// destroyed a body whose request was still open, and undici closes the connection of such a
// request: the next model call paid a new TCP (and TLS) handshake, and every stop built an
// AbortError with its stack. So what follows the final event is read in the background instead,
// within bounds, and the connection goes back to the pool once the body ends.
//
// A Node body (pool-fetch.ts, every provider's) is read by its 'data' events into a channel
// (rpc/channel.ts), not through the stream's async iterator under a generator: at a real model's
// pace each token is a read of its own, and those two layers made a dozen promises a read, about
// 2.9 µs of CPU against 0.8 for this reader (1,000 bodies, one event each a turn, in one process).
import { finished, type Readable } from "node:stream";
import { BYTES_MARK, byteLength, Channel } from "../../shared/rpc/channel.js";

/** How long the rest of a reply may take after its final event before its connection is closed. */
export const REST_MS = 1_000;
/** How many bytes may follow a reply's final event before its connection is closed. */
export const REST_BYTES = 64 * 1024;

/**
 * The body's chunks, until the body ends or `ended()` is true after the caller has handled one;
 * then the rest is read in the background within REST_MS and REST_BYTES. Contract: the caller does
 * not break out of the loop at the final event; stopping early for any other reason (an abort, a
 * failure) destroys the body, and its connection with it.
 */
export function untilFinalEvent(
  body: AsyncIterable<Uint8Array>,
  ended: () => boolean,
): AsyncIterableIterator<Uint8Array> {
  return isNodeStream(body) ? new NodeReply(body, ended) : iteratedReply(body, ended);
}

const isNodeStream = (body: object): body is Readable =>
  typeof (body as Partial<Readable>).on === "function" && typeof (body as Partial<Readable>).pause === "function";

const DONE: IteratorResult<never> = { value: undefined, done: true };

/**
 * A Node body read by its events into a channel weighed in bytes: one promise per chunk the caller
 * waits for, none otherwise; the body is paused while a stream's worth (BYTES_MARK) waits.
 */
class NodeReply implements AsyncIterableIterator<Uint8Array> {
  private readonly chunks = new Channel<Uint8Array>(BYTES_MARK, byteLength);
  /** The caller is done with it: past the final event (rest read in the background), or it left. */
  private released = false;

  constructor(
    private readonly body: Readable,
    private readonly ended: () => boolean,
  ) {
    body.on("data", this.onData);
    // What was read before a failure still reaches the caller; then the failure does.
    finished(body, (err) => this.chunks.end(err ?? undefined));
  }

  next(): Promise<IteratorResult<Uint8Array>> {
    if (this.released) return Promise.resolve(DONE);
    if (this.ended()) {
      this.handOver();
      return Promise.resolve(DONE);
    }
    return this.chunks.next();
  }

  /** The caller left before the final event: the body is cut, its connection with it. */
  return(): Promise<IteratorResult<Uint8Array>> {
    if (!this.released) {
      this.released = true;
      this.body.off("data", this.onData);
      this.chunks.return();
      this.body.destroy();
    }
    return Promise.resolve(DONE);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  private readonly onData = (chunk: Uint8Array): void => {
    if (this.chunks.push(chunk)) return;
    this.body.pause();
    this.chunks.room()?.then(() => this.body.resume());
  };

  /** Past the final event: what follows is read and dropped, within bounds, so the body can end. */
  private handOver(): void {
    this.released = true;
    this.body.off("data", this.onData);
    if (this.chunks.closed) return;
    let bytes = this.chunks.queuedWeight;
    this.chunks.return();
    const cut = () => {
      clearTimeout(timer);
      this.body.destroy();
    };
    const timer = setTimeout(cut, REST_MS);
    timer.unref();
    if (bytes > REST_BYTES) {
      cut();
      return;
    }
    finished(this.body, () => clearTimeout(timer));
    this.body.on("data", (chunk: Uint8Array) => {
      bytes += chunk.byteLength;
      if (bytes > REST_BYTES) cut();
    });
    this.body.resume();
  }
}

/** Any other body (a web stream's), through its own iterator. */
async function* iteratedReply(
  body: AsyncIterable<Uint8Array>,
  ended: () => boolean,
): AsyncGenerator<Uint8Array, void, undefined> {
  const chunks = body[Symbol.asyncIterator]();
  let handedOver = false;
  try {
    for (;;) {
      const next = await chunks.next();
      if (next.done) return;
      yield next.value;
      if (ended()) {
        handedOver = true;
        readRest(chunks);
        return;
      }
    }
  } finally {
    if (!handedOver) await chunks.return?.();
  }
}

/**
 * Reads and drops what follows the final event of an iterated body, so it ends and its connection
 * can carry the next call; stops it once the rest passes REST_MS or REST_BYTES. Never throws.
 */
function readRest(chunks: AsyncIterator<Uint8Array>): void {
  const cut = () => void chunks.return?.().catch(() => undefined);
  const timer = setTimeout(cut, REST_MS);
  timer.unref();
  void (async () => {
    let bytes = 0;
    try {
      for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
        bytes += next.value.byteLength;
        if (bytes > REST_BYTES) return cut();
      }
    } catch {
      // The body failed after its final event.
    } finally {
      clearTimeout(timer);
    }
  })();
}
