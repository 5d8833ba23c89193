// OpenAI's Responses API (provider kind "openai-responses"), the API OpenAI builds its reasoning
// models around: the request is a list of input items, and a reasoning model's reasoning items are
// handed back to us (encrypted, as we keep nothing at OpenAI: store false) and sent back with the
// next request, so the model keeps its reasoning across tool calls instead of starting over.
// Reference: https://platform.openai.com/docs/api-reference/responses/create and .../responses-streaming;
// https://platform.openai.com/docs/guides/reasoning ("keeping reasoning items in context").
import type { Agent } from "undici";
import type { ModelLifecycle } from "../../shared/models/model-lifecycle.js";
import { PROVIDER_KINDS } from "../../shared/models/provider-kinds.js";
import { effortFor, rulesFor, takesImages } from "../../shared/models/model-rules.js";
import { postFitted, type RequestFixes } from "./request-fixes.js";
import {
  ModelError,
  dataUrl,
  classify,
  eventJson,
  providerConnection,
  streamEvents,
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

/** The Responses API's smallest max_output_tokens. */
const MIN_OUTPUT_TOKENS = 16;

type Item = Record<string, unknown>;

/** The conversation as input items; system messages become `instructions` (the first) or system items. */
export function toInput(messages: readonly ModelMessage[], vision = false): { instructions: string; input: Item[] } {
  let instructions = "";
  const input: Item[] = [];
  for (const [i, m] of messages.entries()) {
    switch (m.role) {
      case "system":
        if (i === 0) instructions = m.content;
        else input.push({ role: "system", content: m.content });
        break;
      case "user":
        input.push(
          vision && m.images?.length
            ? {
                role: "user",
                content: [
                  { type: "input_text", text: m.content },
                  ...m.images.map((i) => ({ type: "input_image", image_url: dataUrl(i) })),
                ],
              }
            : { role: "user", content: m.content },
        );
        break;
      case "assistant":
        // Its reasoning first, as the model produced it (only ever from this same model).
        if (m.reasoning) input.push(...(JSON.parse(m.reasoning) as Item[]));
        if (m.content) input.push({ role: "assistant", content: m.content });
        for (const c of m.toolCalls)
          input.push({ type: "function_call", call_id: c.id, name: c.name, arguments: c.argumentsJson });
        break;
      case "tool":
        input.push({ type: "function_call_output", call_id: m.toolCallId, output: m.content });
        break;
    }
  }
  return { instructions, input };
}

interface StreamState {
  /** output_index -> our tool call index. */
  calls: Map<number, number>;
  reasoning: Item[];
  finish?: FinishReason;
  rawFinish: string;
  usage?: ModelUsage;
  responseModel: string;
  responseId: string;
}

export class OpenAIResponsesClient implements ProviderClient {
  private readonly post: ProviderPost;
  private readonly get: ProviderGet;
  private readonly pool: Agent;
  private readonly visionModels: readonly string[];

  /** `fixes`: what this provider refused by name, per model (request-fixes.ts). */
  constructor(
    options: OpenAIModelOptions,
    private readonly fixes?: RequestFixes,
  ) {
    ({ post: this.post, get: this.get, pool: this.pool } = providerConnection(options, "openai-responses"));
    this.visionModels = options.visionModels ?? [];
  }

  providerOf(): string {
    return "openai";
  }

  lifecycle(model: string, signal: AbortSignal): Promise<ModelLifecycle> {
    return PROVIDER_KINDS["openai-responses"].ask(this.get, model, signal);
  }

  /** The request body, fitted to what the model takes (model-rules.ts). */
  body(request: ModelRequest): Record<string, unknown> {
    const rules = rulesFor("openai-responses", request.model);
    const { instructions, input } = toInput(
      request.messages,
      takesImages("openai-responses", request.model, this.visionModels),
    );
    const reasoning = rules.reasoningEfforts.length > 0;
    const effort = effortFor(rules, request.reasoningEffort);
    return {
      model: request.model,
      instructions,
      input,
      stream: true,
      store: false,
      ...(request.tools.length > 0
        ? {
            tools: request.tools.map((t) => ({
              type: "function",
              name: t.name,
              description: t.description,
              parameters: t.parameters,
              strict: false,
            })),
          }
        : {}),
      ...(request.maxTokens ? { max_output_tokens: Math.max(MIN_OUTPUT_TOKENS, request.maxTokens) } : {}),
      ...(request.temperature !== undefined && rules.sampling ? { temperature: request.temperature } : {}),
      // With store false, reasoning comes back only encrypted, and only when asked for.
      ...(reasoning
        ? {
            include: ["reasoning.encrypted_content"],
            ...(effort ? { reasoning: { effort } } : {}),
          }
        : {}),
    };
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    let body: AsyncIterable<Uint8Array>;
    try {
      const response = await postFitted(this.post, this.fixes, "/responses", request.model, this.body(request), signal);
      body = streamedBody(response);
    } catch (err) {
      throw classify(err, signal);
    }
    const state: StreamState = {
      calls: new Map(),
      reasoning: [],
      rawFinish: "",
      responseModel: request.model,
      responseId: "",
    };
    yield* streamEvents(
      body,
      (data) => this.parse(data, state),
      () => state.finish !== undefined,
      signal,
    );
    if (!state.finish) return; // streamEvents threw; for the type checker
    yield {
      type: "done",
      finishReason: state.finish,
      rawFinishReason: state.rawFinish,
      usage: state.usage,
      responseModel: state.responseModel,
      responseId: state.responseId,
      ...(state.reasoning.length > 0 ? { reasoning: JSON.stringify(state.reasoning) } : {}),
    };
  }

  /** One streaming event: the chunks it carries. */
  private *parse(data: string, state: StreamState): Iterable<ModelChunk> {
    const ev = eventJson(data);
    switch (ev.type) {
      case "response.output_text.delta":
        yield { type: "text", delta: String(ev.delta ?? "") };
        return;
      case "response.reasoning_summary_text.delta":
        yield { type: "thinking", delta: String(ev.delta ?? "") };
        return;
      case "response.output_item.added": {
        const item = ev.item as Item;
        if (item?.type !== "function_call") return;
        const index = state.calls.size;
        state.calls.set(Number(ev.output_index), index);
        yield { type: "tool_call", index, id: String(item.call_id), name: String(item.name), argumentsDelta: "" };
        return;
      }
      case "response.function_call_arguments.delta": {
        const index = state.calls.get(Number(ev.output_index));
        if (index !== undefined) yield { type: "tool_call", index, argumentsDelta: String(ev.delta ?? "") };
        return;
      }
      case "response.output_item.done": {
        const item = ev.item as Item;
        if (item?.type === "reasoning")
          state.reasoning.push({
            type: "reasoning",
            id: item.id,
            summary: item.summary ?? [],
            ...(item.encrypted_content ? { encrypted_content: item.encrypted_content } : {}),
          });
        return;
      }
      case "response.completed":
      case "response.incomplete":
        this.finish(ev.response as Item, state);
        return;
      case "response.failed": {
        const error = (ev.response as { error?: { code?: string; message?: string } })?.error;
        throw new ModelError(
          `the model failed: ${error?.message ?? "no reason given"}`,
          true,
          undefined,
          false,
          undefined,
          error?.code,
        );
      }
      case "error":
        throw new ModelError(`the model stream reported an error: ${String(ev.message ?? data.slice(0, 200))}`, true);
    }
  }

  private finish(response: Item, state: StreamState): void {
    const status = String(response?.status ?? "");
    const reason = (response?.incomplete_details as { reason?: string } | null)?.reason ?? "";
    state.rawFinish = reason || status;
    state.finish =
      status === "completed"
        ? state.calls.size > 0
          ? "tool_calls"
          : "stop"
        : reason === "max_output_tokens"
          ? "length"
          : "other";
    state.responseModel = String(response?.model ?? state.responseModel);
    state.responseId = String(response?.id ?? "");
    const u = response?.usage as
      | { input_tokens?: number; output_tokens?: number; input_tokens_details?: { cached_tokens?: number } }
      | undefined;
    if (u)
      state.usage = {
        inputTokens: u.input_tokens ?? 0,
        outputTokens: u.output_tokens ?? 0,
        cacheReadInputTokens: u.input_tokens_details?.cached_tokens ?? 0,
      };
  }

  async close(): Promise<void> {
    await this.pool.close();
  }
}
