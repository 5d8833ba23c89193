// A fetch through the SSRF guard, for clients that take a fetch function and stream what comes
// back (the MCP SDK's Streamable HTTP transport reads server-sent events as they arrive). Every
// hop is checked as guardedRequest checks it (net-guard.ts); what differs is the body: it is not
// buffered but handed on as a stream, cut with an error once it passes `maxBytes`, and it is not
// bounded in time (the client sets its own deadlines through the request's signal). The answer's
// headers must come within `headersTimeoutMs`.
import { guardedOpen, NetRefusal, type NetPolicy } from "./net-guard.js";

export interface GuardedFetchOptions {
  /** Headers added to every hop (a credential kept to its host, say); the request's own win otherwise. */
  headers?: (url: URL) => Record<string, string>;
  /** Bytes one answer may carry; past them its stream errors. */
  maxBytes: number;
  headersTimeoutMs: number;
}

export type FetchLike = (input: string | URL, init?: RequestInit) => Promise<Response>;

const NO_BODY = new Set([101, 204, 205, 304]);

/** A fetch whose every request goes through the guard under `policy`. */
export function guardedFetch(policy: NetPolicy, options: GuardedFetchOptions): FetchLike {
  return async (input, init = {}) => {
    const own = Object.fromEntries(new Headers(init.headers).entries());
    const body = init.body;
    if (body !== undefined && body !== null && typeof body !== "string")
      throw new TypeError("guardedFetch sends string bodies only");
    // Until the headers come the deadline applies; after, only the caller's signal and the cap.
    const request = new AbortController();
    const due = setTimeout(() => request.abort(), options.headersTimeoutMs);
    const stop = () => request.abort();
    init.signal?.addEventListener("abort", stop, { once: true });
    if (init.signal?.aborted) stop();
    let res: Awaited<ReturnType<typeof guardedOpen>>;
    try {
      res = await guardedOpen(
        String(input),
        {
          method: init.method ?? "GET",
          body: body ?? undefined,
          headers: (url) => ({ ...options.headers?.(url), ...own }),
        },
        policy,
        request.signal,
      );
    } catch (err) {
      init.signal?.removeEventListener("abort", stop);
      if (request.signal.aborted && !init.signal?.aborted)
        throw new NetRefusal(`no answer from ${new URL(String(input)).host} within ${options.headersTimeoutMs} ms`);
      throw err;
    } finally {
      clearTimeout(due);
    }
    const headers = new Headers();
    for (const [k, v] of Object.entries(res.headers))
      if (v !== undefined) for (const one of Array.isArray(v) ? v : [v]) headers.append(k, one);
    if (NO_BODY.has(res.status)) {
      res.body.destroy();
      init.signal?.removeEventListener("abort", stop);
      return new Response(null, { status: res.status, headers });
    }
    const release = () => {
      init.signal?.removeEventListener("abort", stop);
      request.abort();
    };
    return new Response(capped(res.body, options.maxBytes, res.url.host, release), {
      status: res.status,
      headers,
    });
  };
}

/** The body as a web stream that errors once more than `maxBytes` came, and lets the socket go when cancelled. */
function capped(
  body: AsyncIterable<Uint8Array> & { destroy(): void },
  maxBytes: number,
  host: string,
  release: () => void,
): ReadableStream<Uint8Array> {
  const it = body[Symbol.asyncIterator]();
  let size = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const next = await it.next();
        if (next.done) {
          release();
          return controller.close();
        }
        size += next.value.byteLength;
        if (size > maxBytes) {
          body.destroy();
          release();
          return controller.error(new NetRefusal(`the answer from ${host} passed ${maxBytes} bytes`));
        }
        controller.enqueue(next.value);
      } catch (err) {
        controller.error(err);
      }
    },
    cancel() {
      body.destroy();
      release();
    },
  });
}
