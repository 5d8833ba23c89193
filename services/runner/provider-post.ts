// One request to an OpenAI-style HTTP API (chat completions, Responses): a JSON body POSTed with
// the key as a bearer token, the streamed answer handed back whole. The official SDK did this, and
// did nothing else for the runner: replies are read by our SSE decoder (sse.ts). Loading the SDK
// cost every runner 9 MB resident (docs/benchmarks.md, bench/footprint), so it is not loaded here.
// What a provider answers with is still tested against servers written from its API reference
// (test/helpers/openai-api.ts, responses-api.ts).
import type { Dispatcher } from "undici";
import { poolFetch } from "./pool-fetch.js";

const USER_AGENT = "troupe-runner";
/** The most of a refusal's body kept for its message: a provider's errors are a few hundred bytes. */
const MAX_ERROR_BYTES = 16 * 1024;

/** The provider answered with a status outside 2xx. `message` is the provider's own wording. */
export class ProviderRefusal extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Headers,
    /** The provider's error code ("unsupported_parameter", "invalid_api_key"), if it gave one. */
    readonly code?: string,
  ) {
    super(message);
    this.name = "ProviderRefusal";
  }
}

export interface ProviderEndpoint {
  /** The API's base, up to and including its version: "https://api.openai.com/v1". */
  baseUrl: string;
  /** Sent as `Authorization: Bearer`; none is sent when empty (a local server without keys). */
  apiKey: string;
}

/**
 * POSTs `body` as JSON to `path` under the endpoint. Contract: resolves with the answer when its
 * status is 2xx (its body unread); throws a ProviderRefusal for any other status, and whatever the
 * fetch threw (refused, reset, timed out, aborted) when there was no answer.
 */
export function providerPoster(
  endpoint: ProviderEndpoint,
  pool: Dispatcher,
): (path: string, body: unknown, signal: AbortSignal) => Promise<Response> {
  const fetch = poolFetch(pool);
  const base = endpoint.baseUrl.replace(/\/+$/, "");
  const headers: Record<string, string> = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "user-agent": USER_AGENT,
  };
  if (endpoint.apiKey) headers.authorization = `Bearer ${endpoint.apiKey}`;
  return async (path, body, signal) => {
    const response = await fetch(`${base}${path}`, { method: "POST", headers, body: JSON.stringify(body), signal });
    if (response.ok) return response;
    const text = await leadingText(response);
    const { message, code } = errorOf(text);
    throw new ProviderRefusal(
      response.status,
      message || `${response.status} ${response.statusText}`,
      response.headers,
      code,
    );
  };
}

/** The first MAX_ERROR_BYTES of an answer's body as text; the rest is not read. */
async function leadingText(response: Response): Promise<string> {
  if (!response.body) return "";
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < MAX_ERROR_BYTES) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      size += value.byteLength;
    }
  } catch {
    // A body cut while we read it still leaves the status, which is what matters.
  } finally {
    reader.cancel().catch(() => undefined);
  }
  return Buffer.concat(parts).subarray(0, MAX_ERROR_BYTES).toString("utf8");
}

/**
 * The message and code of an error body. OpenAI's shape is `{"error": {"message", "type", "code"}}`
 * (platform.openai.com/docs/guides/error-codes); compatible servers also answer `{"error": "..."}`,
 * `{"message": "..."}` or FastAPI's `{"detail": ...}`. Anything else is quoted as it came.
 */
export function errorOf(text: string): { message: string; code?: string } {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return { message: text.trim().slice(0, 500) };
  }
  const obj = (doc ?? {}) as Record<string, unknown>;
  const error = obj.error;
  if (error && typeof error === "object") {
    const e = error as Record<string, unknown>;
    const code = typeof e.code === "string" ? e.code : undefined;
    if (typeof e.message === "string") return { message: e.message, code };
    return { message: JSON.stringify(error).slice(0, 500), code };
  }
  if (typeof error === "string") return { message: error };
  if (typeof obj.message === "string") return { message: obj.message };
  if (obj.detail !== undefined)
    return { message: typeof obj.detail === "string" ? obj.detail : JSON.stringify(obj.detail).slice(0, 500) };
  return { message: text.trim().slice(0, 500) };
}
