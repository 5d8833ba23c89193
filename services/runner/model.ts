// The model, behind one narrow interface: stream a reply to a conversation. The implementation
// speaks the OpenAI chat-completions protocol over an undici connection pool (provider-post.ts,
// pool-fetch.ts), so any OpenAI-compatible endpoint (or Troupe's scripted model server) plugs in
// by URL; providers.ts routes each model to its provider, model-rules.ts fits the request to the
// model. The stream is read by our SSE decoder, which measured faster than the SDK's
// (docs/benchmarks.md); the SDK's types describe the wire format, its code is not loaded.
import type OpenAI from "openai";
import type { Agent } from "undici";
import { rulesFor, takesImages, type ReasoningEffort } from "../shared/model-rules.js";
import type { ProviderKind } from "../shared/providers.js";
import { undiciAgent } from "../shared/undici-agent.js";
import {
  type ProviderPost,
  ProviderRefusal,
  providerPoster,
  retryAfterMs,
  retryableStatus,
} from "../shared/provider-post.js";
import { poolFetch, replyBody } from "./pool-fetch.js";
import { SseDecoder, type SseEvent } from "./sse.js";

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

function toOpenAI(m: ModelMessage, vision: boolean): OpenAI.Chat.ChatCompletionMessageParam {
  switch (m.role) {
    case "system":
      return { role: m.role, content: m.content };
    case "user":
      if (!vision || !m.images?.length) return { role: m.role, content: m.content };
      return {
        role: "user",
        content: [
          { type: "text", text: m.content },
          ...m.images.map((i) => ({ type: "image_url" as const, image_url: { url: dataUrl(i) } })),
        ],
      };
    case "tool":
      return { role: "tool", tool_call_id: m.toolCallId, content: m.content };
    case "assistant":
      return m.toolCalls.length === 0
        ? { role: "assistant", content: m.content }
        : {
            role: "assistant",
            content: m.content || null,
            tool_calls: m.toolCalls.map((c) => ({
              id: c.id,
              type: "function" as const,
              function: { name: c.name, arguments: c.argumentsJson },
            })),
          };
  }
}

interface StreamState {
  finish: string;
  usage?: ModelUsage;
  responseModel: string;
  responseId: string;
}
const DONE = Symbol("done");

const FINISH: Record<string, FinishReason> = {
  stop: "stop",
  tool_calls: "tool_calls",
  function_call: "tool_calls",
  length: "length",
};

export class OpenAIModelClient implements ModelClient {
  private readonly providerName: string;
  private readonly kind: ProviderKind;
  private readonly pool: Agent;
  private readonly post: ProviderPost;
  private readonly visionModels: readonly string[];

  constructor(options: OpenAIModelOptions) {
    ({ post: this.post, pool: this.pool } = openAIConnection(options));
    this.visionModels = options.visionModels ?? [];
    this.kind = options.kind ?? "openai-compatible";
    this.providerName = this.kind === "openai" ? "openai" : "openai_compatible";
  }

  providerOf(): string {
    return this.providerName;
  }

  /** The request body, fitted to what the model takes (model-rules.ts). */
  body(request: ModelRequest): OpenAI.Chat.ChatCompletionCreateParamsStreaming {
    const rules = rulesFor(this.kind, request.model);
    return {
      model: request.model,
      messages: request.messages.map((m) => toOpenAI(m, takesImages(this.kind, request.model, this.visionModels))),
      stream: true,
      stream_options: { include_usage: true },
      ...(request.tools.length > 0
        ? {
            tools: request.tools.map((t) => ({
              type: "function" as const,
              function: { name: t.name, description: t.description, parameters: t.parameters },
            })),
          }
        : {}),
      ...(request.maxTokens ? { [rules.maxTokensField]: request.maxTokens } : {}),
      ...(request.temperature !== undefined && rules.sampling ? { temperature: request.temperature } : {}),
      ...(request.reasoningEffort && rules.reasoningEfforts.includes(request.reasoningEffort)
        ? { reasoning_effort: request.reasoningEffort }
        : {}),
    };
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    let body: AsyncIterable<Uint8Array>;
    try {
      const response = await this.post("/chat/completions", this.body(request), signal);
      body = streamedBody(response);
    } catch (err) {
      throw classify(err, signal);
    }
    const state: StreamState = { finish: "", responseModel: request.model, responseId: "" };
    const decoder = new SseDecoder();
    let ended = false;
    try {
      for await (const bytes of body) {
        // Consecutive text (or thinking) deltas of one network read leave as one chunk: the
        // session would merge them into one event anyway, and this way the loop runs once per
        // read instead of once per token.
        const batch: ModelChunk[] = [];
        for (const sse of decoder.push(bytes)) {
          const out = this.parseEvent(sse, state);
          if (out === DONE) {
            ended = true;
            break;
          }
          for (const c of out ?? []) {
            const last = batch[batch.length - 1];
            if ((c.type === "text" || c.type === "thinking") && last?.type === c.type) last.delta += c.delta;
            else batch.push(c);
          }
        }
        for (const c of batch) yield c;
        if (ended) break;
      }
      if (!ended) for (const sse of decoder.end()) if (this.parseEvent(sse, state) === DONE) break;
    } catch (err) {
      throw classify(err, signal);
    }
    if (signal.aborted) throw new ModelError("aborted", false, undefined, true);
    if (state.finish === "") throw new ModelError("the model stream ended without a finish reason", true);
    yield {
      type: "done",
      finishReason: FINISH[state.finish] ?? "other",
      rawFinishReason: state.finish,
      usage: state.usage,
      responseModel: state.responseModel,
      responseId: state.responseId,
    };
  }

  /** One SSE event of a chat-completions stream: the chunks it carries, or DONE at the end marker. */
  private parseEvent(sse: SseEvent, state: StreamState): ModelChunk[] | typeof DONE | undefined {
    if (sse.data === "[DONE]") return DONE;
    let chunk: OpenAI.Chat.ChatCompletionChunk & { error?: { message?: string } };
    try {
      chunk = JSON.parse(sse.data);
    } catch {
      throw new ModelError(`the model stream sent an event that is not JSON: ${sse.data.slice(0, 200)}`, true);
    }
    if (chunk.error || sse.event === "error")
      throw new ModelError(
        `the model stream reported an error: ${chunk.error?.message ?? sse.data.slice(0, 200)}`,
        true,
      );
    state.responseModel = chunk.model || state.responseModel;
    state.responseId = chunk.id || state.responseId;
    if (chunk.usage) {
      state.usage = {
        inputTokens: chunk.usage.prompt_tokens ?? 0,
        outputTokens: chunk.usage.completion_tokens ?? 0,
        cacheReadInputTokens: chunk.usage.prompt_tokens_details?.cached_tokens ?? 0,
      };
    }
    const choice = chunk.choices?.[0];
    if (!choice) return undefined;
    if (choice.finish_reason) state.finish = choice.finish_reason;
    const delta = choice.delta as
      | (typeof choice.delta & { reasoning_content?: string; reasoning?: string })
      | undefined;
    if (!delta) return undefined;
    const out: ModelChunk[] = [];
    const thinking = delta.reasoning_content ?? delta.reasoning;
    if (thinking) out.push({ type: "thinking", delta: thinking });
    if (delta.content) out.push({ type: "text", delta: delta.content });
    for (const call of delta.tool_calls ?? []) {
      out.push({
        type: "tool_call",
        index: call.index,
        id: call.id,
        name: call.function?.name,
        argumentsDelta: call.function?.arguments ?? "",
      });
    }
    return out;
  }

  async close(): Promise<void> {
    await this.pool.close();
  }
}

export type { ProviderPost };

/**
 * Requests to one provider over one keep-alive undici pool, shared by the runner's sessions. Nothing
 * is retried here: retries and fallbacks belong to the agent loop, which knows whether output was
 * already sent. The pool's headers timeout is the first-byte timeout.
 */
export function openAIConnection(options: OpenAIModelOptions): { post: ProviderPost; pool: Agent } {
  const pool = connectionPool(options);
  const endpoint = { baseUrl: options.baseUrl, apiKey: options.apiKey, headers: options.headers };
  return { post: providerPoster(endpoint, poolFetch(pool) as Parameters<typeof providerPoster>[1]), pool };
}

/**
 * Streamed replies one provider may carry at once from this runner. A streamed reply holds its
 * HTTP/1.1 connection until it ends, so this is a cap on concurrent model calls, not a pool size
 * to economise: at 128, the 129th session waited for another's reply to finish, and 1,000
 * sessions streaming at 30 tokens/s got 3,621 tokens/s instead of 30,000 (bench/stream, paced;
 * docs/benchmarks.md). Runs are bounded by the tenants' concurrentRuns quotas instead.
 */
export const MAX_MODEL_STREAMS = 4096;

/** One keep-alive pool per provider; many sessions share its connections. */
export function connectionPool(options: Pick<OpenAIModelOptions, "timeoutMs" | "idleTimeoutMs">): Agent {
  const Pool = undiciAgent();
  return new Pool({
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
  // Connection refused, reset, cut mid-stream, timeouts: worth another try.
  return new ModelError(`model endpoint unreachable: ${(err as Error)?.message ?? String(err)}`, true);
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
    for await (const bytes of body) {
      for (const sse of decoder.push(bytes)) yield* parse(sse.data);
      if (ended()) break;
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
