// The model, behind one narrow interface: stream a reply to a conversation. This file is the
// contract (requests, chunks, ModelError, ModelClient) and what every provider's client shares:
// one undici connection pool per provider (pool-fetch.ts; the provider's SDK calls over it,
// shared/models/openai-sdk.ts and anthropic-sdk.ts), failures classified as ModelErrors, and the
// streamed body read by our SSE decoder, which measured faster than the SDK's (bench/history.md). The clients: chat-completions-model.ts (OpenAI's chat completions
// and every compatible endpoint, Troupe's scripted model server among them), responses-model.ts,
// anthropic-model.ts; provider-models.ts routes each model to its provider's client.
import type { Agent } from "undici";
import type { ReasoningEffort } from "../../shared/models/model-rules.js";
import type { ProviderKind } from "../../shared/models/providers.js";
import { outboundAgent } from "../../shared/net/outbound-proxy.js";
import type { ModelLifecycle } from "../../shared/models/model-lifecycle.js";
import { PROVIDER_KINDS } from "../../shared/models/provider-kinds.js";
import {
  type Fetch,
  type ProviderGet,
  type ProviderPost,
  ProviderRefusal,
  retryAfterMs,
  retryableStatus,
} from "../../shared/models/provider-post.js";
import { poolFetch, replyBody } from "./pool-fetch.js";
import { SseDecoder, SseEventTooLarge } from "./sse.js";
import { untilFinalEvent } from "./reply-rest.js";

export interface ModelToolCall {
  id: string;
  name: string;
  argumentsJson: string;
}

/** An image for a vision model (shared/images.ts checked it); models without vision never get it. */
export interface ModelImage {
  mimeType: string;
  data: Uint8Array;
}

export type ModelMessage =
  | { role: "system"; content: string }
  | { role: "user"; content: string; images?: readonly ModelImage[] }
  | {
      role: "assistant";
      content: string;
      toolCalls: ModelToolCall[];
      /** The model that wrote it, and its reasoning items (JSON, Responses API) to send back to that model. */
      model?: string;
      reasoning?: string;
    }
  | { role: "tool"; toolCallId: string; content: string };

export interface ModelTool {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

export interface ModelRequest {
  model: string;
  messages: ModelMessage[];
  tools: ModelTool[];
  maxTokens?: number;
  /** Sent only to models that take it (model-rules.ts). */
  temperature?: number;
  /** Sent only to reasoning models, and only a value the model takes. */
  reasoningEffort?: ReasoningEffort;
}

export interface ModelUsage {
  inputTokens: number;
  outputTokens: number;
  cacheReadInputTokens: number;
}

export type FinishReason = "stop" | "tool_calls" | "length" | "other";

/** What a streamed reply yields, in order: deltas, then exactly one `done`. */
export type ModelChunk =
  | { type: "text"; delta: string }
  | { type: "thinking"; delta: string }
  | { type: "tool_call"; index: number; id?: string; name?: string; argumentsDelta: string }
  | {
      type: "done";
      finishReason: FinishReason;
      rawFinishReason: string;
      usage?: ModelUsage;
      responseModel: string;
      responseId: string;
      /** Reasoning items to carry into the next request to this model (Responses API), as JSON. */
      reasoning?: string;
    };

/** The code of a ModelError for a stream that sent an event past the SSE decoder's bound. */
export const EVENT_TOO_LARGE = "stream_event_too_large";

/** A failed model call. `status` is the HTTP status when the endpoint answered. */
export class ModelError extends Error {
  constructor(
    message: string,
    readonly retryable: boolean,
    readonly status?: number,
    readonly aborted = false,
    /** How long the endpoint asked us to wait (Retry-After, retry-after-ms), if it said. */
    readonly retryAfterMs?: number,
    /** The provider's error code, e.g. "unsupported_parameter", when it gave one. */
    readonly code?: string,
  ) {
    super(message);
    this.name = "ModelError";
  }
}

export interface ModelClient {
  /** The provider serving `model`, as gen_ai.provider.name says it. Contract: never throws. */
  providerOf(model: string): string;
  /**
   * Streams one reply. Contract: every failure (refusal, network, bad stream) is thrown as a
   * ModelError; an aborted signal ends the stream with an aborted ModelError.
   */
  stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk>;
  close(): Promise<void>;
}

/** One provider's client, as provider-models.ts routes to it: it can also say what it knows of a model. */
export interface ProviderClient extends ModelClient {
  /** Whether the provider serves `model`, and until when (shared/models/model-lifecycle.ts). Contract: never throws. */
  lifecycle(model: string, signal: AbortSignal): Promise<ModelLifecycle>;
}

export interface OpenAIModelOptions {
  /** Decides the request rules; openai-compatible when not given. */
  kind?: ProviderKind;
  baseUrl: string;
  apiKey: string;
  /** Connect and first-byte timeout. */
  timeoutMs?: number;
  /** Longest silence allowed inside a streamed reply. */
  idleTimeoutMs?: number;
  /** Models that take images besides those model-rules.ts knows (providers.json `visionModels`). */
  visionModels?: readonly string[];
  /** Sent with every request (OpenAI's account headers, providers.ts). */
  headers?: Readonly<Record<string, string>>;
}

/** An image as a data URL, as OpenAI's image inputs take it. */
export const dataUrl = (image: ModelImage): string =>
  `data:${image.mimeType};base64,${Buffer.from(image.data).toString("base64")}`;

export type { ProviderGet, ProviderPost };

/**
 * Requests to one provider over one keep-alive undici pool, shared by the runner's sessions,
 * through the SDK of its kind (shared/models/provider-kinds.ts). Nothing is retried here: retries
 * and fallbacks belong to the agent loop, which knows whether output was already sent. The pool's
 * headers timeout is the first-byte timeout.
 */
export function providerConnection(
  options: OpenAIModelOptions,
  kind: ProviderKind,
): { post: ProviderPost; get: ProviderGet; pool: Agent } {
  const pool = connectionPool(options);
  const endpoint = { baseUrl: options.baseUrl, apiKey: options.apiKey, headers: options.headers };
  return { ...PROVIDER_KINDS[kind].calls(endpoint, poolFetch(pool) as Fetch), pool };
}

/**
 * Connections to one provider from this runner. Over HTTP/1.1 (plain http:// servers) a streamed
 * reply holds its connection until it ends, so this is a cap on concurrent model calls, not a pool
 * size to economise: at 128, the 129th session waited for another's reply to finish, and 1,000
 * sessions streaming at 30 tokens/s got 3,621 tokens/s instead of 30,000 (bench/stream, paced;
 * bench/history.md). Over HTTPS undici offers h2 by ALPN, and each connection then carries up to
 * 100 replies. Runs are bounded by the tenants' concurrentRuns quotas instead.
 */
export const MAX_MODEL_STREAMS = 4096;

/** One keep-alive pool per provider; many sessions share its connections. */
export function connectionPool(options: Pick<OpenAIModelOptions, "timeoutMs" | "idleTimeoutMs">): Agent {
  return outboundAgent({
    connections: MAX_MODEL_STREAMS,
    keepAliveTimeout: 30_000,
    connectTimeout: 10_000,
    headersTimeout: options.timeoutMs ?? 60_000,
    bodyTimeout: options.idleTimeoutMs ?? 120_000,
  });
}

/** Any failure of a model call as a ModelError: aborted, an HTTP status with its code, or unreachable. */
export function classify(err: unknown, signal: AbortSignal): ModelError {
  if (err instanceof ModelError) return err;
  if (signal.aborted) return new ModelError("aborted", false, undefined, true);
  if (err instanceof ProviderRefusal) {
    return new ModelError(
      `model endpoint answered ${err.status}: ${err.message}`,
      retryableStatus(err.status),
      err.status,
      false,
      retryAfterMs(err.headers),
      err.code,
    );
  }
  // A stream that broke the decoder's bound would break it again: not tried again; the next model
  // of the chain (another provider, maybe) gets the turn.
  if (err instanceof SseEventTooLarge)
    return new ModelError(err.message, false, undefined, false, undefined, EVENT_TOO_LARGE);
  const message = (err as Error)?.message ?? String(err);
  // The outbound proxy (HTTPS_PROXY, HTTP_PROXY) said no, in undici's words: its own failures
  // (502, 503) may pass, a refusal (407: credentials; 403: a host it does not allow) will not.
  const proxyStatus = /^Proxy Authentication Required \((\d+)\)|^Proxy response \((\d+)\) !== 200/.exec(message);
  if (proxyStatus) {
    const status = Number(proxyStatus[1] ?? proxyStatus[2]);
    return new ModelError(
      `the outbound proxy refused the call with ${status}${status === 407 ? " (its credentials go in the proxy URL: http://user:password@host:port)" : ""}; check HTTPS_PROXY, HTTP_PROXY and NO_PROXY`,
      status >= 500,
    );
  }
  // Connection refused, reset, cut mid-stream, timeouts: worth another try.
  return new ModelError(`model endpoint unreachable: ${message}`, true);
}

/** A streamed reply's body (pool-fetch.ts), or a retryable ModelError when it came without one. */
export function streamedBody(response: Response): AsyncIterable<Uint8Array> {
  const body = replyBody(response);
  if (!body) throw new ModelError("the model endpoint answered without a body", true);
  return body;
}

/** The endpoint refused the request as longer than the model's context window. */
export function isContextOverflow(err: ModelError): boolean {
  return (
    (err.status === 400 || err.status === 413) &&
    /context.length|maximum context|context window|too many tokens|prompt is too long|context_length_exceeded/i.test(
      err.message,
    )
  );
}

/**
 * The chunks of a streamed body whose events `parse` reads, until `ended()` says the final event
 * came. Failures reading become ModelErrors by `classify`; an abort is an aborted ModelError; a body
 * that stops before its final event is a retryable one.
 */
export async function* streamEvents(
  body: AsyncIterable<Uint8Array>,
  parse: (data: string) => Iterable<ModelChunk>,
  ended: () => boolean,
  signal: AbortSignal,
  classifyError: (err: unknown, signal: AbortSignal) => ModelError = classify,
): AsyncIterable<ModelChunk> {
  const decoder = new SseDecoder();
  try {
    for await (const bytes of untilFinalEvent(body, ended)) {
      for (const sse of decoder.push(bytes)) yield* parse(sse.data);
    }
    if (!ended()) for (const sse of decoder.end()) yield* parse(sse.data);
  } catch (err) {
    throw classifyError(err, signal);
  }
  if (signal.aborted) throw new ModelError("aborted", false, undefined, true);
  if (!ended()) throw new ModelError("the model stream ended before its final event", true);
}

/** One event's JSON, or a retryable ModelError naming what came instead. */
export function eventJson(data: string): Record<string, unknown> & { type?: string } {
  try {
    return JSON.parse(data);
  } catch {
    throw new ModelError(`the model stream sent an event that is not JSON: ${data.slice(0, 200)}`, true);
  }
}
