// The fetch model calls make over a runner's undici pool (provider-post.ts, and the Anthropic SDK):
// they build the request and read error answers; the runner reads a streamed reply itself, once per network read for every
// session on the runner. Through undici's fetch each of those reads passed a WHATWG stream and
// fetch's own controller; the profile of the paced benchmark put about a tenth of the runner's
// CPU there (bench/history.md, bench/stream). So the request is made with the pool's `request`,
// whose body is a Node stream, and `replyBody` hands the runner that stream. The Response the caller
// gets is still a whole one: its body reads the same Node stream when something reads it.
// Redirects are followed here rather than by undici's interceptor, which keeps the request's body
// for as long as the request lives (`outgoing` says why that matters).
import { Readable, pipeline } from "node:stream";
import { createBrotliDecompress, createGunzip, createInflate } from "node:zlib";
import type { Dispatcher } from "undici";

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
const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 20;
/** What fetch drops when a redirect turns the request into a GET without a body. */
const CONTENT_HEADERS = ["content-encoding", "content-language", "content-location", "content-type", "content-length"];
/**
 * What is not sent to another origin: fetch drops authorization, undici's redirects the cookie and
 * proxy credentials too, and the providers' own key headers (Anthropic's x-api-key, Azure OpenAI's
 * api-key) are the same secret under another name.
 */
const CREDENTIAL_HEADERS = ["authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"];

/**
 * A fetch over `pool`. Contract: the same answers and failures as fetch, for string and byte
 * bodies: redirects are followed as fetch follows them (at most 20; credentials dropped on a
 * cross-origin one), and a gzip, deflate or brotli answer arrives decompressed. A long string body
 * is held only until the answer's headers arrive, not while its reply streams (`outgoing`).
 */
export function poolFetch(pool: Dispatcher): (input: string | URL | Request, init?: FetchInit) => Promise<Response> {
  return async (input, init = {}) => {
    let url = new URL(typeof input === "string" || input instanceof URL ? input : input.url);
    let body = init.body ?? undefined;
    if (body !== undefined && typeof body !== "string" && !(body instanceof Uint8Array))
      throw new TypeError("poolFetch sends string and byte bodies only");
    const headers: Record<string, string> = {};
    new Headers(init.headers ?? undefined).forEach((value, name) => {
      headers[name] = value;
    });
    let method = (init.method ?? "GET").toUpperCase();
    for (let redirects = 0; ; redirects++) {
      const reply = await pool.request({
        origin: url.origin,
        path: `${url.pathname}${url.search}`,
        method: method as Dispatcher.HttpMethod,
        ...outgoing(body, headers),
        signal: init.signal ?? undefined,
      });
      const location = REDIRECTS.has(reply.statusCode) ? oneValue(reply.headers.location) : undefined;
      if (location === undefined) return response(reply, method);
      await reply.body.dump();
      if (redirects === MAX_REDIRECTS) throw new TypeError("fetch failed: more than 20 redirects");
      const next = new URL(location, url);
      if (next.protocol !== "http:" && next.protocol !== "https:")
        throw new TypeError(`fetch failed: a redirect to ${next.protocol} is not followed`);
      const status = reply.statusCode;
      if (((status === 301 || status === 302) && method === "POST") || (status === 303 && method !== "HEAD")) {
        method = "GET";
        body = undefined;
        for (const name of CONTENT_HEADERS) delete headers[name];
      }
      if (next.origin !== url.origin) for (const name of CREDENTIAL_HEADERS) delete headers[name];
      url = next;
    }
  };
}

const oneValue = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

/** A Response as fetch gives it, whose Node body `replyBody` hands the runner. */
function response(reply: Dispatcher.ResponseData, method: string): Response {
  const answerHeaders = new Headers();
  for (const [name, value] of Object.entries(reply.headers)) {
    if (Array.isArray(value)) for (const v of value) answerHeaders.append(name, v);
    else if (value !== undefined) answerHeaders.set(name, value);
  }
  const noBody = method === "HEAD" || NO_BODY.has(reply.statusCode);
  const raw = reply.body as unknown as Readable;
  if (noBody) raw.resume();
  const source = noBody ? raw : decoded(raw, answerHeaders.get("content-encoding"));
  const answer = new Response(noBody ? null : lazyWebStream(source), {
    status: reply.statusCode,
    headers: answerHeaders,
  });
  if (!noBody) nodeBodies.set(answer, source);
  return answer;
}

/** Characters per piece of a long string body (at most three bytes each in UTF-8). */
const PIECE_CHARS = 64 * 1024;

/**
 * A body as undici should send it, with the headers that go with it. undici keeps the bytes of a
 * string body (a copy of the whole) until the request ends, which for a streamed model reply is
 * its whole length: a runner's long contexts (hundreds of KB each call) then pile up as
 * old-generation garbage until a major collection (the long soak, bench/history.md). A long one
 * goes out in pieces made as they are written, each dead once written, and the string itself is
 * released once the last is made.
 */
function outgoing(
  body: string | Uint8Array | undefined,
  headers: Record<string, string>,
): { body?: string | Uint8Array | Readable; headers: Record<string, string> } {
  if (typeof body !== "string" || body.length <= PIECE_CHARS) return { body, headers };
  // undici cannot work out the length of a body sent in pieces; a string's is its UTF-8 length.
  const length = String(Buffer.byteLength(body));
  return {
    body: Readable.from(pieces(body), { objectMode: false }),
    headers: { ...headers, "content-length": length },
  };
}

/**
 * `text`'s UTF-8 bytes, a piece at a time. `text` is let go before the last piece: a reader that
 * stops at the content length never resumes the generator past it.
 */
function* pieces(text: string): Generator<Buffer> {
  for (let at = 0; at < text.length; ) {
    let end = Math.min(at + PIECE_CHARS, text.length);
    // Never between the two halves of a surrogate pair: each half alone would be sent as U+FFFD.
    if (end < text.length && isHighSurrogate(text.charCodeAt(end - 1))) end += 1;
    const piece = Buffer.from(text.slice(at, end));
    if (end === text.length) text = "";
    at = end;
    yield piece;
  }
}

const isHighSurrogate = (code: number): boolean => code >= 0xd800 && code <= 0xdbff;

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
