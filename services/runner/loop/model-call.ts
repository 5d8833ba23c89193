// Model calls: the request fitted to the window (compacting first when needed), the reply streamed
// into an assistant message, retries with backoff and Retry-After, the fallback chain, and a
// compaction on a context overflow.
// tools, prompt, hooks); the loop itself holds no state between runs.
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { SpanKind, SpanStatusCode } from "@opentelemetry/api";
import {
  ChatMessageSchema,
  Role,
  StopReason,
  UsageSchema,
  ToolCallSchema,
  type ChatMessage,
  type Usage,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { newId } from "../../shared/ids.js";
import { instruments, secondsSince } from "../../shared/process/metrics.js";
import { GenAI, tracer } from "../../shared/process/telemetry.js";
import {
  EVENT_TOO_LARGE,
  ModelError,
  isContextOverflow,
  type FinishReason,
  type ModelRequest,
} from "../providers/model.js";
import { fitNewestFirst, toModelMessages } from "../session/transcript.js";
import { report, type Turn } from "./run.js";
import { compact, conversationView, countExactly, viewTokens } from "./compaction.js";

/** The shortest reply a request may leave room for; below it, the context is cut further. */
const MIN_REPLY_TOKENS = 256;

/**
 * The next request: the view of the conversation, compacted first when it would pass the window
 * minus the reserve, then fitted newest-first; max_tokens is what the window leaves.
 */
export async function buildRequest(
  turn: Turn,
  model: string,
): Promise<{ request: ModelRequest; promptTokens: number }> {
  const { agent } = turn;
  const limit = agent.contextWindow - agent.reserveTokens;
  let view = conversationView(turn.host);
  let promptTokens = viewTokens(turn, view);
  // Past this, the count decides a compaction or the reply's room: the bound will not do.
  if (promptTokens > Math.min(limit, agent.contextWindow - agent.maxOutputTokens)) {
    await countExactly(turn);
    promptTokens = viewTokens(turn, view);
  }
  if (promptTokens > limit && (await compact(turn, "threshold", promptTokens))) {
    view = conversationView(turn.host);
    promptTokens = viewTokens(turn, view);
  }
  if (promptTokens > limit) {
    // Still too long (one huge block, or a summary that could not shrink it): oldest blocks go.
    const fixed = promptTokens - view.messages.reduce((n, m) => n + turn.tokens.message(m), 0);
    const from = fitNewestFirst(view.messages, Math.max(0, limit - fixed), turn.tokens);
    view = {
      summary: view.summary,
      messages: view.messages.slice(Math.min(from, Math.max(0, view.messages.length - 1))),
    };
    promptTokens = viewTokens(turn, view);
  }
  // A nearly full context still leaves MIN_REPLY_TOKENS for the reply; never more than asked for.
  const maxTokens = Math.min(
    agent.maxOutputTokens,
    Math.max(MIN_REPLY_TOKENS, Math.min(agent.maxOutputTokens, agent.contextWindow - promptTokens)),
  );
  return {
    request: {
      model,
      messages: toModelMessages(turn.system.text, view.summary, view.messages),
      tools: turn.tools,
      maxTokens,
      temperature: agent.temperature,
      reasoningEffort: agent.reasoningEffort,
    },
    promptTokens,
  };
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done);
  });

/** Exponential backoff with ±25% jitter: base, 2×base, 4×base, ... */
export function backoffMs(attempt: number, baseMs: number, random = Math.random): number {
  return Math.round(baseMs * 2 ** attempt * (0.75 + 0.5 * random()));
}

/** A request this model refuses as written (a parameter or value it does not take): another may not. */
const REFUSED_REQUEST = new Set(["unsupported_parameter", "unsupported_value", "model_not_found"]);

/**
 * Errors another model may not have: rate limits, overload, outages, auth, a model not served, a
 * refused request, a broken stream.
 */
const fallbackWorthy = (e: ModelError) =>
  e.retryable ||
  e.status === 401 ||
  e.status === 403 ||
  e.status === 404 ||
  e.code === EVENT_TOO_LARGE ||
  (e.code !== undefined && REFUSED_REQUEST.has(e.code));

/**
 * One model call of the run. A failure that sent nothing to the client is retried (retryable
 * errors, with backoff, Retry-After honoured up to the policy's limit), then handed to the next
 * model of the chain; an overflow compacts the context and tries once more. Once output reached
 * the client, a failure ends the call: a retry would show it a different reply over the first.
 */
export async function callModel(turn: Turn): Promise<{ message: ChatMessage; errorMessage: string }> {
  const { host, agent } = turn;
  let chain = turn.modelAt;
  let retries = 0;
  let compacted = false;
  for (;;) {
    const model = turn.models[chain];
    const { request, promptTokens } = await buildRequest(turn, model);
    const attempt = await streamAssistant(turn, request, retries > 0 || chain > 0);
    if (!attempt.failure) {
      turn.modelAt = chain;
      return { message: attempt.message!, errorMessage: "" };
    }
    const e = attempt.failure;
    if (!e.aborted && !attempt.outputSent && !host.signal.aborted) {
      if (!compacted && isContextOverflow(e)) {
        compacted = true;
        if (await compact(turn, "overflow", promptTokens)) continue;
      }
      if (e.retryable && retries < agent.retry.maxRetries) {
        const delay = Math.max(e.retryAfterMs ?? 0, backoffMs(retries, agent.retry.baseDelayMs));
        if (delay <= agent.retry.maxDelayMs) {
          retries++;
          host.emit({
            case: "modelRetry",
            value: { model, attempt: retries, delayMs: delay, reason: e.message, httpStatus: e.status ?? 0 },
          });
          await sleep(delay, host.signal);
          if (!host.signal.aborted) continue;
        }
      }
      if (fallbackWorthy(e) && chain + 1 < turn.models.length && !host.signal.aborted) {
        // A refusal is the operator's to fix (the model or its rules): said as an error, not only a fallback.
        if (!e.retryable) report(host, "MODEL_REQUEST_REFUSED", `${model}: ${e.message}`);
        chain++;
        retries = 0;
        host.emit({
          case: "modelFallback",
          value: { fromModel: model, toModel: turn.models[chain], reason: e.message },
        });
        continue;
      }
    }
    return {
      message: failedAssistant(turn, model, attempt, e),
      errorMessage: e.aborted || host.signal.aborted ? "" : e.message,
    };
  }
}

interface Attempt {
  /** Set when the reply completed. */
  message?: ChatMessage;
  failure?: ModelError;
  /** Deltas of this attempt reached the client. */
  outputSent: boolean;
  /** The partial reply of a failed attempt. */
  partial: { id: string; text: string; thinking: string };
}

/** The failed call's message: partial text kept, partial tool calls dropped (they must never run). */
function failedAssistant(turn: Turn, model: string, attempt: Attempt, e: ModelError): ChatMessage {
  const { host } = turn;
  const aborted = e.aborted || host.signal.aborted;
  const { id, text, thinking } = attempt.partial;
  const message = create(ChatMessageSchema, {
    id,
    role: Role.ASSISTANT,
    model,
    text,
    thinking,
    stopReason: aborted ? StopReason.ABORTED : StopReason.ERROR,
    time: timestampNow(),
  });
  if (!attempt.outputSent) host.emit({ case: "messageStart", value: { message: { id, role: Role.ASSISTANT, model } } });
  if (!aborted)
    host.emit({ case: "error", value: { code: "MODEL_ERROR", message: e.message, retryable: e.retryable } });
  host.emit({ case: "messageEnd", value: { message } });
  host.messages.push(message);
  return message;
}

const STOP_BY_FINISH: Record<FinishReason, StopReason> = {
  stop: StopReason.COMPLETED,
  tool_calls: StopReason.TOOL_USE,
  length: StopReason.LENGTH,
  other: StopReason.COMPLETED,
};

/**
 * Streams one attempt. message_start goes out with the first chunk, so an attempt that fails
 * before answering leaves no trace but the retry or fallback event.
 */
async function streamAssistant(turn: Turn, request: ModelRequest, isRetry: boolean): Promise<Attempt> {
  const { host, deps } = turn;
  const id = newId();
  const span = tracer.startSpan(`chat ${request.model}`, {
    kind: SpanKind.CLIENT,
    attributes: {
      [GenAI.OPERATION_NAME]: "chat",
      [GenAI.PROVIDER_NAME]: deps.model.providerOf(request.model),
      [GenAI.REQUEST_MODEL]: request.model,
      [GenAI.REQUEST_STREAM]: true,
      [GenAI.REQUEST_MAX_TOKENS]: request.maxTokens ?? 0,
      [GenAI.CONVERSATION_ID]: host.sessionId,
      ...(isRetry ? { "troupe.model.retry": true } : {}),
    },
  });
  const started = performance.now();
  const measured = {
    [GenAI.OPERATION_NAME]: "chat",
    [GenAI.PROVIDER_NAME]: deps.model.providerOf(request.model),
    [GenAI.REQUEST_MODEL]: request.model,
  };
  let firstChunk = true;
  const message = create(ChatMessageSchema, { id, role: Role.ASSISTANT, model: request.model });
  const calls: { id: string; name: string; args: string }[] = [];
  const attempt: Attempt = { outputSent: false, partial: { id, text: "", thinking: "" } };
  const opened = () => {
    if (attempt.outputSent) return;
    attempt.outputSent = true;
    host.emit({ case: "messageStart", value: { message: { id, role: Role.ASSISTANT, model: request.model } } });
  };
  try {
    for await (const chunk of deps.model.stream(request, host.signal)) {
      if (firstChunk) {
        firstChunk = false;
        span.setAttribute(GenAI.RESPONSE_TIME_TO_FIRST_CHUNK, secondsSince(started));
        instruments().timeToFirstChunk.record(secondsSince(started), measured);
      }
      switch (chunk.type) {
        case "text":
          opened();
          attempt.partial.text += chunk.delta;
          host.delta(id, "text", chunk.delta);
          break;
        case "thinking":
          opened();
          attempt.partial.thinking += chunk.delta;
          host.delta(id, "thinking", chunk.delta);
          break;
        case "tool_call": {
          opened();
          const call = (calls[chunk.index] ??= { id: "", name: "", args: "" });
          if (chunk.id) call.id = chunk.id;
          if (chunk.name) call.name += chunk.name;
          call.args += chunk.argumentsDelta;
          host.emit({
            case: "messageUpdate",
            value: {
              messageId: id,
              delta: {
                case: "toolCall",
                value: {
                  index: chunk.index,
                  id: chunk.id ?? "",
                  name: chunk.name ?? "",
                  argumentsDelta: chunk.argumentsDelta,
                },
              },
            },
          });
          break;
        }
        case "done": {
          opened();
          message.stopReason = calls.length > 0 ? StopReason.TOOL_USE : STOP_BY_FINISH[chunk.finishReason];
          if (chunk.finishReason === "other") {
            report(
              host,
              "MODEL_FINISH_REASON",
              `the model stopped for an unknown reason (finish_reason ${JSON.stringify(chunk.rawFinishReason)}); its reply is taken as complete`,
            );
          }
          if (chunk.reasoning) message.reasoning = chunk.reasoning;
          if (chunk.usage) {
            const u = chunk.usage;
            message.usage = create(UsageSchema, {
              inputTokens: u.inputTokens,
              outputTokens: u.outputTokens,
              cacheReadInputTokens: u.cacheReadInputTokens,
              totalTokens: u.inputTokens + u.outputTokens,
            });
            host.emit({ case: "usage", value: { model: chunk.responseModel, usage: message.usage } });
            span.setAttributes({
              [GenAI.USAGE_INPUT_TOKENS]: u.inputTokens,
              [GenAI.USAGE_OUTPUT_TOKENS]: u.outputTokens,
            });
            countTokens(measured, deps.tenant, u.inputTokens, u.outputTokens);
          }
          span.setAttributes({
            [GenAI.RESPONSE_MODEL]: chunk.responseModel,
            [GenAI.RESPONSE_ID]: chunk.responseId,
            [GenAI.RESPONSE_FINISH_REASONS]: [chunk.rawFinishReason],
          });
          break;
        }
      }
      const wait = host.pressure();
      if (wait) await wait;
    }
    message.toolCalls = calls.map((c, i) =>
      create(ToolCallSchema, { id: c.id || `call_${id}_${i}`, name: c.name, argumentsJson: c.args }),
    );
  } catch (err) {
    const e = err instanceof ModelError ? err : new ModelError(String((err as Error)?.message ?? err), false);
    if (!e.aborted) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
      span.setAttribute(GenAI.ERROR_TYPE, e.status ? String(e.status) : "network");
    }
    span.end();
    instruments().modelDuration.record(secondsSince(started), {
      ...measured,
      [GenAI.ERROR_TYPE]: e.aborted ? "aborted" : e.status ? String(e.status) : "network",
    });
    attempt.failure = e;
    return attempt;
  }
  message.text = attempt.partial.text;
  message.thinking = attempt.partial.thinking;
  message.time = timestampNow();
  host.emit({ case: "messageEnd", value: { message } });
  host.messages.push(message);
  span.end();
  instruments().modelDuration.record(secondsSince(started), measured);
  attempt.message = message;
  return attempt;
}

/** Tokens by type for the model call, and for its tenant. */
function countTokens(measured: Record<string, string>, tenant: string, input: number, output: number): void {
  const m = instruments();
  m.tokens.record(input, { ...measured, "gen_ai.token.type": "input" });
  m.tokens.record(output, { ...measured, "gen_ai.token.type": "output" });
  m.tenantTokens.add(input, { tenant, "gen_ai.token.type": "input" });
  m.tenantTokens.add(output, { tenant, "gen_ai.token.type": "output" });
}

export function addUsage(total: Usage, u: Usage | undefined): void {
  if (!u) return;
  total.inputTokens += u.inputTokens;
  total.outputTokens += u.outputTokens;
  total.cacheReadInputTokens += u.cacheReadInputTokens;
  total.totalTokens += u.totalTokens;
}
