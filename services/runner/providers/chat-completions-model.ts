// OpenAI's chat-completions protocol, which any OpenAI-compatible endpoint (or Troupe's scripted
// model server) speaks: the request body fitted to the model (model-rules.ts), and the streamed
// reply's events turned into chunks. The SDK's types describe the wire format; its code is not
// loaded.
import type OpenAI from "openai";
import type { Agent } from "undici";
import type { ModelLifecycle } from "../../shared/models/model-lifecycle.js";
import { PROVIDER_KINDS } from "../../shared/models/provider-kinds.js";
import { effortFor, rulesFor, takesImages } from "../../shared/models/model-rules.js";
import type { ProviderKind } from "../../shared/models/providers.js";
import { postFitted, type RequestFixes } from "./request-fixes.js";
import { SseDecoder, type SseEvent } from "./sse.js";
import { untilFinalEvent } from "./reply-rest.js";
import {
  ModelError,
  classify,
  dataUrl,
  providerConnection,
  streamedBody,
  type FinishReason,
  type ModelChunk,
  type ProviderClient,
  type ModelMessage,
  type ModelRequest,
  type ModelUsage,
  type OpenAIModelOptions,
  type ProviderGet,
  type ProviderPost,
} from "./model.js";

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

/** gen_ai.provider.name by kind: OpenAI's own API, else any other server speaking its protocol. */
const GEN_AI_PROVIDER: Partial<Record<ProviderKind, string>> = { openai: "openai" };

export class OpenAIModelClient implements ProviderClient {
  private readonly providerName: string;
  private readonly kind: ProviderKind;
  private readonly pool: Agent;
  private readonly post: ProviderPost;
  private readonly get: ProviderGet;
  private readonly visionModels: readonly string[];

  /** `fixes`: what this provider refused by name, per model (request-fixes.ts). */
  constructor(
    options: OpenAIModelOptions,
    private readonly fixes?: RequestFixes,
  ) {
    this.kind = options.kind ?? "openai-compatible";
    ({ post: this.post, get: this.get, pool: this.pool } = providerConnection(options, this.kind));
    this.visionModels = options.visionModels ?? [];
    this.providerName = GEN_AI_PROVIDER[this.kind] ?? "openai_compatible";
  }

  providerOf(): string {
    return this.providerName;
  }

  /** OpenAI is asked (model-lifecycle.ts); a compatible server is not. */
  lifecycle(model: string, signal: AbortSignal): Promise<ModelLifecycle> {
    return PROVIDER_KINDS[this.kind].ask(this.get, model, signal);
  }

  /** The request body, fitted to what the model takes (model-rules.ts). */
  body(request: ModelRequest): OpenAI.Chat.ChatCompletionCreateParamsStreaming {
    const rules = rulesFor(this.kind, request.model);
    const effort = effortFor(rules, request.reasoningEffort);
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
      ...(effort ? { reasoning_effort: effort } : {}),
    };
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    let body: AsyncIterable<Uint8Array>;
    try {
      const response = await postFitted(
        this.post,
        this.fixes,
        "/chat/completions",
        request.model,
        this.body(request),
        signal,
      );
      body = streamedBody(response);
    } catch (err) {
      throw classify(err, signal);
    }
    const state: StreamState = { finish: "", responseModel: request.model, responseId: "" };
    const decoder = new SseDecoder();
    let ended = false;
    try {
      for await (const bytes of untilFinalEvent(body, () => ended)) {
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
