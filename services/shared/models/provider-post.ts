// One request to a model provider's HTTP API, and what every provider's calls share: the refusal
// (ProviderRefusal, with the provider's own words from any of the error shapes servers use), the
// retry decision and Retry-After, a bounded JSON answer. OpenAI's kinds send through the `openai`
// SDK (openai-sdk.ts); Anthropic's Messages API is POSTed here as plain JSON (providerPoster). What
// a provider answers with is tested against servers written from its API reference
// (test/helpers/openai-api.ts, responses-api.ts, embeddings-api.ts, anthropic-api.ts).

import { BodyTooLarge, jsonUpTo, readUpTo } from "../net/bounded-body.js";

/** The most of a refusal's body kept for its message: a provider's errors are a few hundred bytes. */
const MAX_ERROR_BYTES = 16 * 1024;
/**
 * The most of a provider's message kept, whether it came in a known error shape or was quoted as
 * it came: it reaches the client's error event and the logs, and a long one is a provider echoing
 * input back, not explaining more. A cut message ends in "…".
 */
const MAX_MESSAGE = 500;
const quoted = (text: string) => {
  const trimmed = text.trim();
  return trimmed.length <= MAX_MESSAGE ? trimmed : `${trimmed.slice(0, MAX_MESSAGE - 1)}…`;
};

/** The provider answered with a status outside 2xx. `message` is the provider's own wording. */
export class ProviderRefusal extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Headers,
    /** The provider's error code ("unsupported_parameter", "invalid_api_key"), if it gave one. */
    readonly code?: string,
    /** The request field the error is about ("max_tokens"), if the provider named one. */
    readonly param?: string,
  ) {
    super(message);
    this.name = "ProviderRefusal";
  }
}

export interface ProviderEndpoint {
  /** The API's base, up to and including its version: "https://api.openai.com/v1". */
  baseUrl: string;
  /** The key (a bearer token, or Anthropic's x-api-key); none is sent when empty (a local server without keys). */
  apiKey: string;
  /** More headers for every request (OpenAI's account headers, providers.ts). */
  headers?: Readonly<Record<string, string>>;
}

export type Fetch = (
  url: string,
  init: { method: string; headers: Record<string, string>; body?: string; signal: AbortSignal },
) => Promise<Response>;
/**
 * POSTs `body` as JSON to `path` under the endpoint. Contract: resolves with the answer when its
 * status is 2xx (its body unread); throws a ProviderRefusal for any other status, and whatever the
 * fetch threw (refused, reset, timed out, aborted) when there was no answer.
 */
export type ProviderPost = (path: string, body: unknown, signal: AbortSignal) => Promise<Response>;
/** GETs `path` under the endpoint (a model's description). Contract: as ProviderPost's. */
export type ProviderGet = (path: string, signal: AbortSignal) => Promise<Response>;

/** A ProviderRefusal for an answer outside 2xx, with the provider's message and code (its first 16 KiB read). */
export async function refusal(response: Response): Promise<ProviderRefusal> {
  const text = await leadingText(response);
  const { message, code, param } = errorOf(text);
  return new ProviderRefusal(
    response.status,
    message || `${response.status} ${response.statusText}`,
    response.headers,
    code,
    param,
  );
}

/** The first MAX_ERROR_BYTES of an answer's body as text; the rest is not read. */
async function leadingText(response: Response): Promise<string> {
  const { bytes } = await readUpTo(response.body, MAX_ERROR_BYTES);
  // A body cut while we read it still leaves the status, which is what matters.
  return bytes.subarray(0, MAX_ERROR_BYTES).toString("utf8");
}

/**
 * The message, code and param of an error body. OpenAI's shape is `{"error": {"message", "type", "param", "code"}}`
 * (platform.openai.com/docs/guides/error-codes); compatible servers also answer `{"error": "..."}`,
 * `{"message": "..."}` or FastAPI's `{"detail": ...}`. Anything else is quoted as it came.
 */
export function errorOf(text: string): { message: string; code?: string; param?: string } {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return { message: quoted(text) };
  }
  const obj = (doc ?? {}) as Record<string, unknown>;
  const error = obj.error;
  if (error && typeof error === "object") {
    const e = error as Record<string, unknown>;
    const code = typeof e.code === "string" ? e.code : undefined;
    const param = typeof e.param === "string" ? e.param : undefined;
    const named = param === undefined ? {} : { param };
    if (typeof e.message === "string") return { message: quoted(e.message), code, ...named };
    return { message: quoted(JSON.stringify(error)), code, ...named };
  }
  if (typeof error === "string") return { message: quoted(error) };
  if (typeof obj.message === "string") return { message: quoted(obj.message) };
  if (obj.detail !== undefined)
    return { message: quoted(typeof obj.detail === "string" ? obj.detail : JSON.stringify(obj.detail)) };
  return { message: quoted(text) };
}

/**
 * The version of Anthropic's Messages API whose bodies the runner and the memory service send
 * (MessageCreateParams of @anthropic-ai/sdk 1.13, which sends the same `anthropic-version`).
 */
export const ANTHROPIC_VERSION = "2026-10-21";

/** Statuses worth one more try: timeout, conflict, rate limit, the provider's own failures. */
export const retryableStatus = (status: number): boolean =>
  status === 408 || status === 409 || status === 429 || status >= 500;

/** The longest Retry-After a background call waits for before its one retry. */
const MAX_RETRY_WAIT_MS = 10_000;

/**
 * A JSON answer to one POST, for calls whose answer is read whole (learning, embeddings). Each try
 * is bounded by `timeoutMs`, and its answer by `maxBytes`: a broken endpoint must not fill the
 * service's memory. A retryable refusal or a failed connection gets one more try, after the
 * provider's Retry-After (at most 10 s) or half a second. Contract: resolves with the parsed
 * answer; rejects with a ProviderRefusal, a timeout or connection error, a BodyTooLarge, or a
 * SyntaxError for an answer that is not JSON (the last two are not tried again).
 */
export async function postForJson(
  post: ProviderPost,
  path: string,
  body: unknown,
  timeoutMs: number,
  maxBytes: number,
): Promise<unknown> {
  for (let attempt = 0; ; attempt++) {
    try {
      const response = await post(path, body, AbortSignal.timeout(timeoutMs));
      return await jsonUpTo(response, maxBytes);
    } catch (err) {
      const refused = err instanceof ProviderRefusal;
      if (attempt > 0 || err instanceof SyntaxError || err instanceof BodyTooLarge) throw err;
      if (refused && !retryableStatus(err.status)) throw err;
      const asked = refused ? retryAfterMs(err.headers) : undefined;
      await new Promise((r) => setTimeout(r, Math.min(asked ?? 500, MAX_RETRY_WAIT_MS)));
    }
  }
}

/** A Retry-After (seconds or an HTTP date) or retry-after-ms header, in milliseconds. */
export function retryAfterMs(headers: Headers | undefined, now = Date.now()): number | undefined {
  const ms = headers?.get("retry-after-ms");
  if (ms && /^\d+(\.\d+)?$/.test(ms.trim())) return Math.ceil(Number(ms));
  const value = headers?.get("retry-after")?.trim();
  if (!value) return undefined;
  if (/^\d+(\.\d+)?$/.test(value)) return Math.ceil(Number(value) * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
