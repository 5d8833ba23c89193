// Reading an HTTP answer's body no further than the reader needs. A body read whole before its
// size is checked (response.text(), arrayBuffer()) lets whoever answers decide how much memory the
// service spends: a broken model endpoint, or a chat platform's file that is bigger than it said.

/**
 * A body (a Node stream or a fetch answer's) read until it ends or passes `limit` bytes, then let
 * go: leaving the loop early ends the stream, so the rest is not read. `over`: it passed the
 * limit (`bytes` holds what came, a little past it); `failed`: reading threw, after `bytes`.
 */
export async function readUpTo(
  body: AsyncIterable<Uint8Array> | null,
  limit: number,
): Promise<{ bytes: Buffer; over: boolean; failed?: unknown }> {
  const parts: Uint8Array[] = [];
  let size = 0;
  let failed: unknown;
  try {
    for await (const chunk of body ?? []) {
      parts.push(chunk);
      size += chunk.byteLength;
      if (size > limit) break;
    }
  } catch (err) {
    failed = err;
  }
  return { bytes: Buffer.concat(parts, size), over: size > limit, failed };
}

/** A body read to its end, or to `maxBytes`: what came (at most maxBytes), and whether it was cut. Throws what reading threw. */
export async function readCapped(
  body: AsyncIterable<Uint8Array> | null,
  maxBytes: number,
): Promise<{ data: Buffer; truncated: boolean }> {
  const { bytes, over, failed } = await readUpTo(body, maxBytes);
  if (failed !== undefined) throw failed;
  return { data: over ? bytes.subarray(0, maxBytes) : bytes, truncated: over };
}

/**
 * A file's bytes from `url`: empty when the answer is not 2xx or the file is longer than
 * `maxBytes` (then no more than that is read). Throws when the request or the read fails.
 */
export async function downloadUpTo(url: string, init: RequestInit, maxBytes: number): Promise<Uint8Array> {
  const res = await fetch(url, init);
  if (!res.ok) {
    await res.body?.cancel().catch(() => undefined);
    return new Uint8Array();
  }
  const { data, truncated } = await readCapped(res.body, maxBytes);
  return truncated ? new Uint8Array() : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/** An answer longer than its reader's bound (jsonUpTo); the rest of it was not read. */
export class BodyTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`the answer is longer than ${limit} bytes; the rest was not read`);
    this.name = "BodyTooLarge";
  }
}

/**
 * A JSON answer of at most `limit` bytes. Throws a BodyTooLarge when it is longer (having read no
 * more than that), what reading threw when it failed, a SyntaxError when it is not JSON.
 */
export async function jsonUpTo(response: Response, limit: number): Promise<unknown> {
  const { data, truncated } = await readCapped(response.body, limit);
  if (truncated) throw new BodyTooLarge(limit);
  return JSON.parse(data.toString("utf8"));
}

/** Lets go of a body whose content does not matter: a short one is read (its connection can serve again), a long one cut. */
export async function discardBody(response: Response): Promise<void> {
  await readUpTo(response.body, 64 * 1024);
}
