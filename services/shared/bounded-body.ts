// Reading an HTTP answer's body no further than the reader needs. A body read whole before its
// size is checked (response.text(), arrayBuffer()) lets whoever answers decide how much memory the
// service spends: a broken model endpoint, or a chat platform's file that is bigger than it said.

/**
 * A body read until it ends or passes `limit` bytes, then let go (the rest is not read, and the
 * connection is released). `over`: it passed the limit; `failed`: reading it threw, after the
 * bytes returned.
 */
export async function readUpTo(
  response: Response,
  limit: number,
): Promise<{ bytes: Buffer; over: boolean; failed?: unknown }> {
  if (!response.body) return { bytes: Buffer.alloc(0), over: false };
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  let failed: unknown;
  try {
    while (size <= limit) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      size += value.byteLength;
    }
  } catch (err) {
    failed = err;
  } finally {
    reader.cancel().catch(() => undefined);
  }
  return { bytes: Buffer.concat(parts, size), over: size > limit, failed };
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
  const { bytes, over, failed } = await readUpTo(res, maxBytes);
  if (failed !== undefined) throw failed;
  return over ? new Uint8Array() : new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
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
  const { bytes, over, failed } = await readUpTo(response, limit);
  if (failed !== undefined) throw failed;
  if (over) throw new BodyTooLarge(limit);
  return JSON.parse(bytes.toString("utf8"));
}

/** Lets go of a body whose content does not matter: a short one is read (its connection can serve again), a long one cut. */
export async function discardBody(response: Response): Promise<void> {
  await readUpTo(response, 64 * 1024);
}
