// Anthropic's Messages API (provider kind "anthropic"), called through `@anthropic-ai/sdk`
// (shared/models/anthropic-sdk.ts), its streamed reply read by the runner's SSE decoder. Anthropic's OpenAI-compatible
// endpoint is, in its own words, for testing and comparing, not for production; the native API is
// where thinking and prompt caching are. A reasoning effort asks the model to
// think as it takes it (model-rules.ts): adaptive thinking and output_config.effort on Claude 4.6
// and later, a budget_tokens on earlier models. The thinking blocks come back signed and are sent
// back, first in the assistant message, with the next request to the same model (the API
// requires it while tool use goes on). The API version sent (ANTHROPIC_VERSION, 2026-10-21) takes
// no temperature: model-rules.ts says so, and none is sent.
// Reference: https://docs.anthropic.com/en/api/messages, .../messages-streaming,
// https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking, and
// https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking.
import { type ProviderGet, type ProviderPost, ProviderRefusal } from "../../shared/models/provider-post.js";
import type { ThinkingDisplay } from "../../shared/models/providers.js";
import type { Agent } from "undici";
import type { ModelLifecycle } from "../../shared/models/model-lifecycle.js";
import { PROVIDER_KINDS } from "../../shared/models/provider-kinds.js";
import {
  type AnthropicEffort,
  type AnthropicThinking,
  anthropicRulesFor,
  effortFor,
} from "../../shared/models/model-rules.js";
import {
  ModelError,
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
} from "./model.js";

/** Thinking tokens per effort; the API's floor is 1024, and the budget must stay below max_tokens. */
const THINKING_BUDGET: Record<AnthropicEffort, number> = { low: 1024, medium: 4096, high: 16_384 };

/**
 * The fields that ask `thinking`'s kind of model to think at `effort`: adaptive thinking and the
 * effort; or a budget, with the effort where the model takes one, and nothing when the budget
 * would not fit under max_tokens (the API refuses a budget that does not).
 */
function thinkingFields(
  thinking: AnthropicThinking,
  effort: AnthropicEffort,
  maxTokens: number,
  display: ThinkingDisplay,
): Record<string, unknown> {
  // Opus 4.7 and later omit their thinking text unless asked (display "omitted" is their
  // default); clients of a session see the thinking of every model that thinks, so it is asked
  // for unless the providers file says otherwise. Earlier adaptive models summarize by default.
  if (thinking.mode === "adaptive") return { thinking: { type: "adaptive", display }, output_config: { effort } };
  const budget = THINKING_BUDGET[effort];
  if (budget >= maxTokens) return {};
  return {
    thinking: { type: "enabled", budget_tokens: budget },
    ...(thinking.effort ? { output_config: { effort } } : {}),
  };
}

type Block = Record<string, unknown>;
type Turn = { role: "user" | "assistant"; content: Block[] };

/** Arguments as the JSON object the API wants; a model's broken JSON is sent as an empty object. */
function inputOf(argumentsJson: string): Record<string, unknown> {
  try {
    const v = JSON.parse(argumentsJson || "{}");
    return v && typeof v === "object" && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

/** The conversation as the API takes it: system text apart; tool results in the user turn after the call. */
export function toMessages(messages: readonly ModelMessage[]): { system: string; messages: Turn[] } {
  const system: string[] = [];
  const out: Turn[] = [];
  const push = (role: Turn["role"], blocks: Block[]) => {
    if (blocks.length === 0) return;
    const last = out[out.length - 1];
    // Consecutive turns of one role are one turn (tool results, then the user's next words).
    if (last?.role === role) last.content.push(...blocks);
    else out.push({ role, content: blocks });
  };
  for (const m of messages) {
    switch (m.role) {
      case "system":
        system.push(m.content);
        break;
      case "user":
        // Images before the text, as Anthropic's vision guide advises.
        push("user", [
          ...(m.images ?? []).map((i) => ({
            type: "image",
            source: { type: "base64", media_type: i.mimeType, data: Buffer.from(i.data).toString("base64") },
          })),
          ...(m.content !== "" ? [{ type: "text", text: m.content }] : []),
        ]);
        break;
      case "assistant":
        push("assistant", [
          ...(m.reasoning ? (JSON.parse(m.reasoning) as Block[]) : []),
          ...(m.content !== "" ? [{ type: "text", text: m.content }] : []),
          ...m.toolCalls.map((c) => ({ type: "tool_use", id: c.id, name: c.name, input: inputOf(c.argumentsJson) })),
        ]);
        break;
      case "tool":
        push("user", [{ type: "tool_result", tool_use_id: m.toolCallId, content: m.content || "(no output)" }]);
        break;
    }
  }
  return { system: system.join("\n\n"), messages: out };
}

const FINISH: Record<string, FinishReason> = {
  end_turn: "stop",
  stop_sequence: "stop",
  tool_use: "tool_calls",
  max_tokens: "length",
};

interface StreamState {
  /** content block index -> our tool call index. */
  calls: Map<number, number>;
  /** Thinking blocks being assembled, by content block index. */
  thinking: Map<number, Block>;
  stop: string;
  ended: boolean;
  usage: ModelUsage;
  responseModel: string;
  responseId: string;
}

export class AnthropicModelClient implements ProviderClient {
  private readonly post: ProviderPost;
  private readonly get: ProviderGet;
  private readonly pool: Agent;
  private readonly display: ThinkingDisplay;

  constructor(options: OpenAIModelOptions & { thinkingDisplay?: ThinkingDisplay }) {
    ({ post: this.post, get: this.get, pool: this.pool } = providerConnection(options, "anthropic"));
    this.display = options.thinkingDisplay ?? "summarized";
  }

  providerOf(): string {
    return "anthropic";
  }

  lifecycle(model: string, signal: AbortSignal): Promise<ModelLifecycle> {
    return PROVIDER_KINDS.anthropic.ask(this.get, model, signal);
  }

  /** The request body, fitted to what the model takes (model-rules.ts). */
  body(request: ModelRequest): Record<string, unknown> {
    const rules = anthropicRulesFor(request.model);
    const { system, messages } = toMessages(request.messages);
    const maxTokens = request.maxTokens ?? 4096;
    const effort = effortFor(rules, request.reasoningEffort);
    return {
      model: request.model,
      max_tokens: maxTokens,
      ...(system ? { system } : {}),
      messages,
      // Automatic prompt caching: the marker goes on the last cacheable block, so each step of a
      // run reads the conversation so far from the cache instead of paying for it again.
      cache_control: { type: "ephemeral" },
      stream: true,
      ...(request.tools.length > 0
        ? {
            tools: request.tools.map((t) => ({ name: t.name, description: t.description, input_schema: t.parameters })),
          }
        : {}),
      ...(effort ? thinkingFields(rules.thinking, effort, maxTokens, this.display) : {}),
      ...(request.temperature !== undefined && rules.sampling ? { temperature: request.temperature } : {}),
    };
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    let body: AsyncIterable<Uint8Array>;
    try {
      const response = await this.post("/v1/messages", this.body(request), signal);
      body = streamedBody(response);
    } catch (err) {
      throw classifyAnthropic(err, signal);
    }
    const state: StreamState = {
      calls: new Map(),
      thinking: new Map(),
      stop: "",
      ended: false,
      usage: { inputTokens: 0, outputTokens: 0, cacheReadInputTokens: 0 },
      responseModel: request.model,
      responseId: "",
    };
    yield* streamEvents(
      body,
      (data) => this.parse(data, state),
      () => state.ended,
      signal,
      classifyAnthropic,
    );
    const thinking = [...state.thinking.entries()].sort(([a], [b]) => a - b).map(([, b]) => b);
    yield {
      type: "done",
      finishReason: FINISH[state.stop] ?? "other",
      rawFinishReason: state.stop,
      usage: state.usage,
      responseModel: state.responseModel,
      responseId: state.responseId,
      ...(thinking.length > 0 ? { reasoning: JSON.stringify(thinking) } : {}),
    };
  }

  /** One streaming event: the chunks it carries. */
  private *parse(data: string, state: StreamState): Iterable<ModelChunk> {
    const ev = eventJson(data);
    const index = Number(ev.index);
    switch (ev.type) {
      case "message_start": {
        const m = ev.message as { id?: string; model?: string; usage?: Record<string, number> };
        state.responseId = m?.id ?? "";
        state.responseModel = m?.model ?? state.responseModel;
        state.usage.inputTokens = (m?.usage?.input_tokens ?? 0) + (m?.usage?.cache_read_input_tokens ?? 0);
        state.usage.cacheReadInputTokens = m?.usage?.cache_read_input_tokens ?? 0;
        return;
      }
      case "content_block_start": {
        const block = ev.content_block as Block;
        if (block?.type === "tool_use") {
          const n = state.calls.size;
          state.calls.set(index, n);
          yield { type: "tool_call", index: n, id: String(block.id), name: String(block.name), argumentsDelta: "" };
        } else if (block?.type === "thinking")
          state.thinking.set(index, { type: "thinking", thinking: "", signature: "" });
        else if (block?.type === "redacted_thinking") state.thinking.set(index, { ...block });
        return;
      }
      case "content_block_delta": {
        const d = ev.delta as Block;
        if (d?.type === "text_delta") yield { type: "text", delta: String(d.text ?? "") };
        else if (d?.type === "input_json_delta") {
          const n = state.calls.get(index);
          if (n !== undefined) yield { type: "tool_call", index: n, argumentsDelta: String(d.partial_json ?? "") };
        } else if (d?.type === "thinking_delta") {
          const b = state.thinking.get(index);
          if (b) b.thinking = `${b.thinking}${d.thinking ?? ""}`;
          yield { type: "thinking", delta: String(d.thinking ?? "") };
        } else if (d?.type === "signature_delta") {
          const b = state.thinking.get(index);
          if (b) b.signature = `${b.signature}${d.signature ?? ""}`;
        }
        return;
      }
      case "message_delta":
        state.stop = String((ev.delta as { stop_reason?: string })?.stop_reason ?? state.stop);
        state.usage.outputTokens = Number((ev.usage as { output_tokens?: number })?.output_tokens ?? 0);
        return;
      case "message_stop":
        state.ended = true;
        return;
      case "error": {
        const e = ev.error as { type?: string; message?: string } | undefined;
        throw new ModelError(
          `the model stream reported an error: ${e?.message ?? data.slice(0, 200)}`,
          true,
          undefined,
          false,
          undefined,
          e?.type,
        );
      }
    }
  }

  async close(): Promise<void> {
    await this.pool.close();
  }
}

/**
 * Any failure as a ModelError, as every client classifies it; Anthropic's errors carry no code, so
 * a 400 naming a field or value the model does not take is marked as a refusal to fall back from.
 */
function classifyAnthropic(err: unknown, signal: AbortSignal): ModelError {
  const e = classify(err, signal);
  const refused =
    err instanceof ProviderRefusal &&
    err.status === 400 &&
    /not permitted|not supported|unsupported/i.test(err.message);
  return refused
    ? new ModelError(e.message, e.retryable, e.status, e.aborted, e.retryAfterMs, "unsupported_parameter")
    : e;
}
