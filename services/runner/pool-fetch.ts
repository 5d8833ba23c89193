// The fetch the provider SDKs call, over a runner's undici pool. The SDKs build the request and
// read error answers; the runner reads a streamed reply itself, once per network read for every
// session on the runner. Through undici's fetch each of those reads passed a WHATWG stream and
// fetch's own controller; the profile of the paced benchmark put about a tenth of the runner's
// CPU there (docs/benchmarks.md, bench/stream). So the request is made with the pool's `request`,
// whose body is a Node stream, and `replyBody` hands the runner that stream. The Response the SDK
// gets is still a whole one: its body reads the same Node stream when something reads it.
import { type Readable, pipeline } from "node:stream";
import { createBrotliDecompress, createGunzip, createInflate } from "node:zlib";
import { type Dispatcher, interceptors } from "undici";

/** The Node body of each Response made here, for `replyBody`. */
const nodeBodies = new WeakMap<Response, Readable>();

type FetchInit = {
  method?: string;
  headers?: ConstructorParameters<typeof Headers>[0];
  body?: unknown;
  signal?: AbortSignal | null;
};

/** Null-body statuses: a Response with one of them cannot be given a body. */
const NO_BODY = new Set([204, 205, 304]);

/**
 * A fetch over `pool`. Contract: the same answers and failures as fetch, for string and byte
 * bodies: redirects are followed as fetch follows them (at most 20; credentials dropped on a
 * cross-origin one), and a gzip, deflate or brotli answer arrives decompressed.
 */
export function poolFetch(pool: Dispatcher): (input: string | URL | Request, init?: FetchInit) => Promise<Response> {
  const dispatcher = pool.compose(interceptors.redirect({ maxRedirections: 20 }));
  return async (input, init = {}) => {
    const url = new URL(typeof input === "string" || input instanceof URL ? input : input.url);
    const body = init.body;
    if (body !== undefined && body !== null && typeof body !== "string" && !(body instanceof Uint8Array))
      throw new TypeError("poolFetch sends string and byte bodies only");
    const headers: Record<string, string> = {};
    new Headers(init.headers ?? undefined).forEach((value, name) => {
      headers[name] = value;
    });
    const method = (init.method ?? "GET").toUpperCase();
    const reply = await dispatcher.request({
      origin: url.origin,
      path: `${url.pathname}${url.search}`,
      method: method as Dispatcher.HttpMethod,
      headers,
      body: (body ?? undefined) as string | Uint8Array | undefined,
      signal: init.signal ?? undefined,
    });
    const answerHeaders = new Headers();
    for (const [name, value] of Object.entries(reply.headers)) {
      if (Array.isArray(value)) for (const v of value) answerHeaders.append(name, v);
      else if (value !== undefined) answerHeaders.set(name, value);
    }
    const noBody = method === "HEAD" || NO_BODY.has(reply.statusCode);
    const raw = reply.body as unknown as Readable;
    if (noBody) raw.resume();
    const source = noBody ? raw : decoded(raw, answerHeaders.get("content-encoding"));
    const response = new Response(noBody ? null : lazyWebStream(source), {
      status: reply.statusCode,
      headers: answerHeaders,
    });
    if (!noBody) nodeBodies.set(response, source);
    return response;
  };
}

/**
 * The body of a Response from `poolFetch` as the Node stream it is, else the Response's own body.
 * Read one or the other, never both.
 */
export function replyBody(response: Response): AsyncIterable<Uint8Array> | null {
  return nodeBodies.get(response) ?? (response.body as unknown as AsyncIterable<Uint8Array> | null);
}

/**
 * The body decompressed when it came with one content coding fetch would undo; as it came
 * otherwise. (Node's zlib, not undici's decompress interceptor: that one is experimental and says
 * so on stderr, a plain line among the JSON logs.)
 */
function decoded(body: Readable, coding: string | null): Readable {
  const decoder = DECODERS[coding?.trim().toLowerCase() ?? ""];
  if (!decoder) return body;
  return pipeline(body, decoder(), () => undefined);
}

const DECODERS: Record<string, (() => NodeJS.ReadWriteStream & Readable) | undefined> = {
  gzip: createGunzip,
  "x-gzip": createGunzip,
  deflate: createInflate,
  br: createBrotliDecompress,
};

/** A web stream that reads `source` only when pulled: a body nobody reads through it costs nothing. */
function lazyWebStream(source: Readable): ReadableStream<Uint8Array> {
  let iterator: AsyncIterator<Uint8Array> | undefined;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        iterator ??= source[Symbol.asyncIterator]();
        const next = await iterator.next();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
      cancel(reason) {
        source.destroy(reason instanceof Error ? reason : undefined);
      },
      // No read ahead: with the default of 1, the stream pulls once as soon as it is made.
    },
    { highWaterMark: 0 },
  );
}
