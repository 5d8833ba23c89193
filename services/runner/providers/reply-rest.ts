// Reading a streamed model reply up to its final event without giving up its connection.
//
// A reply's final event ([DONE], message_stop, response.completed) can come before the end of its
// HTTP body: the last piece of a chunked body goes out when the server, or a proxy on the way,
// ends the response, and it often arrives in a read of its own. Stopping at the final event then
// destroyed a body whose request was still open, and undici closes the connection of such a
// request: the next model call paid a new TCP (and TLS) handshake, and every stop built an
// AbortError with its stack. So what follows the final event is read in the background instead,
// within bounds, and the connection goes back to the pool once the body ends.
import type { Readable } from "node:stream";

/** How long the rest of a reply may take after its final event before its connection is closed. */
export const REST_MS = 1_000;
/** How many bytes may follow a reply's final event before its connection is closed. */
export const REST_BYTES = 64 * 1024;

/**
 * The body's chunks, until the body ends or `ended()` is true after the caller has handled one;
 * then the rest is read in the background (readRest). Contract: the caller does not break out of
 * the loop at the final event; stopping early for any other reason (an abort, a failure) destroys
 * the body, and its connection with it, as before.
 */
export async function* untilFinalEvent(
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
        readRest(body, chunks);
        return;
      }
    }
  } finally {
    if (!handedOver) await chunks.return?.();
  }
}

/**
 * Reads and drops what follows the final event, so the body ends and its connection can carry the
 * next call; cuts the body (closing the connection) once the rest passes REST_MS or REST_BYTES.
 * Contract: never throws; a failure here costs nothing of the reply, which was whole.
 */
function readRest(body: AsyncIterable<Uint8Array>, chunks: AsyncIterator<Uint8Array>): void {
  const cut = () => {
    // A Node body (pool-fetch.ts) is destroyed at once, its connection with it. Another kind of
    // body (a web stream) stops once its pending read settles.
    (body as Partial<Readable>).destroy?.();
    chunks.return?.().catch(() => undefined);
  };
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
      // The body failed after its final event (a reset, or the cut above).
    } finally {
      clearTimeout(timer);
    }
  })();
}
