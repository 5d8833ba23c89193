// The agent loop: one run, from the message that starts it to agent_end.
//
//   outer loop (follow-ups):
//     inner loop (steps):
//       inject pending user messages
//       stream the assistant's reply                       -> chat span
//       run its tool calls one by one; before each, look    -> execute_tool spans
//         for steering: if some arrived, the rest of the
//         batch is skipped (paired results say so) and the
//         steering messages are injected before the next model call
//     when the model stops asking for tools, take the follow-ups queued meanwhile
//
// Side effects come in through RunHost (events, queues, the abort signal) and RunDeps (model,
// tools, prompt); the loop itself holds no state between runs.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { SpanKind, SpanStatusCode, context, trace, type Context } from "@opentelemetry/api";
import {
  ChatMessageSchema,
  FrameKind,
  Role,
  StopReason,
  UsageSchema,
  ToolCallSchema,
  type AgentEventSchema,
  type ChatMessage,
  type ToolCall,
  type Usage,
} from "../shared/gen/troupe/v1/session_pb.js";
import { failpoint } from "../shared/failpoints.js";
import { newId } from "../shared/ids.js";
import { GenAI, tracer } from "../shared/telemetry.js";
import { ModelError, type FinishReason, type ModelClient, type ModelMessage } from "./model.js";
import type { Tool } from "./tools.js";

export type EventPayload = NonNullable<MessageInitShape<typeof AgentEventSchema>["payload"]>;

/** A user message waiting to enter a run. */
export interface QueuedMessage {
  frameId: string;
  kind: FrameKind;
  text: string;
  /** Trace context of the frame that carried it. */
  traceContext: Context;
}

export interface RunHost {
  readonly sessionId: string;
  readonly signal: AbortSignal;
  /** The conversation so far; the loop appends to it. */
  readonly messages: ChatMessage[];
  emit(payload: EventPayload): void;
  /** Streamed text or thinking; consecutive deltas may be merged into one event. */
  delta(messageId: string, kind: "text" | "thinking", text: string): void;
  /** Resolves when every subscriber can take more events (backpressure). */
  pressure(): Promise<void> | undefined;
  takeSteering(): QueuedMessage[];
  takeFollowUps(): QueuedMessage[];
}

export interface RunDeps {
  agentId: string;
  modelName: string;
  model: ModelClient;
  tools: readonly Tool[];
  /** The system prompt for a run that answers `query` (may consult memory). */
  systemPrompt(query: string, signal: AbortSignal): Promise<string>;
  /**
   * Called once a run completed, with what the user and the assistant said in it (learning from
   * the turn happens here). It must not block: the run has ended and the reply is out.
   */
  afterRun?(sessionId: string, exchange: { role: "user" | "assistant"; text: string }[]): void;
}

export interface RunOutcome {
  stopReason: StopReason;
  errorMessage: string;
}

const SKIPPED_BY_STEER = "Skipped due to queued user message.";
const SKIPPED_BY_ABORT = "Not run: the run was aborted.";

/** Runs the agent for the messages that start the run (usually one; several in collect mode). */
export async function runAgent(host: RunHost, deps: RunDeps, initial: QueuedMessage[]): Promise<RunOutcome> {
  const first = initial[0];
  const span = tracer.startSpan(
    `invoke_agent ${deps.agentId}`,
    {
      kind: SpanKind.INTERNAL,
      attributes: {
        [GenAI.OPERATION_NAME]: "invoke_agent",
        [GenAI.PROVIDER_NAME]: deps.model.providerName,
        [GenAI.AGENT_ID]: deps.agentId,
        [GenAI.AGENT_NAME]: deps.agentId,
        [GenAI.CONVERSATION_ID]: host.sessionId,
        [GenAI.REQUEST_MODEL]: deps.modelName,
      },
    },
    first.traceContext,
  );
  const usage = create(UsageSchema);
  const startedAt = host.messages.length;
  try {
    const outcome = await context.with(trace.setSpan(first.traceContext, span), () => runLoop(host, deps, initial, usage));
    span.setAttributes({ [GenAI.USAGE_INPUT_TOKENS]: usage.inputTokens, [GenAI.USAGE_OUTPUT_TOKENS]: usage.outputTokens });
    if (outcome.stopReason === StopReason.ERROR) span.setStatus({ code: SpanStatusCode.ERROR, message: outcome.errorMessage });
    host.emit({ case: "agentEnd", value: { stopReason: outcome.stopReason, errorMessage: outcome.errorMessage, usage } });
    if (outcome.stopReason === StopReason.COMPLETED && deps.afterRun) {
      const exchange = host.messages
        .slice(startedAt)
        .filter((m) => (m.role === Role.USER || m.role === Role.ASSISTANT) && m.text.trim() !== "")
        .map((m) => ({ role: m.role === Role.USER ? ("user" as const) : ("assistant" as const), text: m.text }));
      if (exchange.length > 0) deps.afterRun(host.sessionId, exchange);
    }
    return outcome;
  } finally {
    span.end();
  }
}

async function runLoop(host: RunHost, deps: RunDeps, initial: QueuedMessage[], usage: Usage): Promise<RunOutcome> {
  host.emit({ case: "agentStart", value: { agentId: deps.agentId, model: deps.modelName, frameId: initial[0].frameId } });
  const query = initial.map((q) => q.text).join("\n");
  failpoint("runner.run", query);
  const system = await deps.systemPrompt(query, host.signal);
  let pending: QueuedMessage[] = initial;
  let step = 0;
  for (;;) {
    for (;;) {
      step++;
      host.emit({ case: "turnStart", value: { step } });
      // Messages taken from the queues always reach the history, even when the run is aborted
      // before it could answer them: an acknowledged message is never dropped.
      injectUserMessages(host, pending);
      pending = [];
      if (host.signal.aborted) {
        host.emit({ case: "turnEnd", value: { step, stopReason: StopReason.ABORTED } });
        return { stopReason: StopReason.ABORTED, errorMessage: "" };
      }
      const { message: assistant, errorMessage } = await streamAssistant(host, deps, system);
      addUsage(usage, assistant.usage);
      const calls = assistant.toolCalls;
      if (assistant.stopReason === StopReason.ERROR || assistant.stopReason === StopReason.ABORTED) {
        host.emit({ case: "turnEnd", value: { step, stopReason: assistant.stopReason } });
        return { stopReason: assistant.stopReason, errorMessage };
      }
      pending = calls.length > 0 ? await executeToolCalls(host, deps, assistant) : [];
      host.emit({ case: "turnEnd", value: { step, stopReason: assistant.stopReason } });
      if (host.signal.aborted) {
        injectUserMessages(host, pending); // steering taken during the batch, kept (see above)
        return { stopReason: StopReason.ABORTED, errorMessage: "" };
      }
      if (calls.length === 0) {
        // Steering that arrived while the final answer streamed gets its own step.
        pending = host.takeSteering();
        if (pending.length === 0) {
          if (assistant.stopReason === StopReason.LENGTH) return { stopReason: StopReason.LENGTH, errorMessage: "" };
          break;
        }
      }
    }
    pending = host.takeFollowUps();
    if (pending.length === 0) return { stopReason: StopReason.COMPLETED, errorMessage: "" };
  }
}

/** Puts user messages into the conversation, each announced as applied. Also used by recovery. */
export function injectUserMessages(host: Pick<RunHost, "emit" | "messages">, queued: readonly QueuedMessage[]): void {
  for (const q of queued) {
    host.emit({ case: "queueApplied", value: { frameId: q.frameId, kind: q.kind } });
    const message = create(ChatMessageSchema, { id: newId(), role: Role.USER, text: q.text, frameId: q.frameId, time: timestampNow() });
    pushMessage(host, message);
  }
}

/** Complete messages are announced (message_start, message_end) and join the conversation. */
function pushMessage(host: Pick<RunHost, "emit" | "messages">, message: ChatMessage): void {
  host.emit({ case: "messageStart", value: { message } });
  host.emit({ case: "messageEnd", value: { message } });
  host.messages.push(message);
}

function toModelMessages(system: string, history: readonly ChatMessage[]): ModelMessage[] {
  const out: ModelMessage[] = [{ role: "system", content: system }];
  for (const m of history) {
    switch (m.role) {
      case Role.USER:
        out.push({ role: "user", content: m.text });
        break;
      case Role.ASSISTANT:
        // A failed reply with nothing in it carries no information for the model.
        if (m.text === "" && m.toolCalls.length === 0) break;
        out.push({ role: "assistant", content: m.text, toolCalls: m.toolCalls.map((c) => ({ id: c.id, name: c.name, argumentsJson: c.argumentsJson })) });
        break;
      case Role.TOOL:
        out.push({ role: "tool", toolCallId: m.toolCallId, content: m.text });
        break;
    }
  }
  return out;
}

const STOP_BY_FINISH: Record<FinishReason, StopReason> = {
  stop: StopReason.COMPLETED,
  tool_calls: StopReason.TOOL_USE,
  length: StopReason.LENGTH,
  other: StopReason.COMPLETED,
};

/** Streams one reply; a failed or aborted call still yields the (partial) message, with why. */
async function streamAssistant(host: RunHost, deps: RunDeps, system: string): Promise<{ message: ChatMessage; errorMessage: string }> {
  const id = newId();
  const span = tracer.startSpan(`chat ${deps.modelName}`, {
    kind: SpanKind.CLIENT,
    attributes: {
      [GenAI.OPERATION_NAME]: "chat",
      [GenAI.PROVIDER_NAME]: deps.model.providerName,
      [GenAI.REQUEST_MODEL]: deps.modelName,
      [GenAI.REQUEST_STREAM]: true,
      [GenAI.CONVERSATION_ID]: host.sessionId,
    },
  });
  const started = performance.now();
  const message = create(ChatMessageSchema, { id, role: Role.ASSISTANT, model: deps.modelName });
  host.emit({ case: "messageStart", value: { message: { id, role: Role.ASSISTANT, model: deps.modelName } } });
  const calls: { id: string; name: string; args: string }[] = [];
  let text = "";
  let thinking = "";
  let firstChunk = true;
  try {
    const request = { model: deps.modelName, messages: toModelMessages(system, host.messages), tools: deps.tools.map(({ name, description, parameters }) => ({ name, description, parameters })) };
    for await (const chunk of deps.model.stream(request, host.signal)) {
      if (firstChunk) {
        firstChunk = false;
        span.setAttribute(GenAI.RESPONSE_TIME_TO_FIRST_CHUNK, (performance.now() - started) / 1000);
      }
      switch (chunk.type) {
        case "text":
          text += chunk.delta;
          host.delta(id, "text", chunk.delta);
          break;
        case "thinking":
          thinking += chunk.delta;
          host.delta(id, "thinking", chunk.delta);
          break;
        case "tool_call": {
          const call = (calls[chunk.index] ??= { id: "", name: "", args: "" });
          if (chunk.id) call.id = chunk.id;
          if (chunk.name) call.name += chunk.name;
          call.args += chunk.argumentsDelta;
          host.emit({
            case: "messageUpdate",
            value: { messageId: id, delta: { case: "toolCall", value: { index: chunk.index, id: chunk.id ?? "", name: chunk.name ?? "", argumentsDelta: chunk.argumentsDelta } } },
          });
          break;
        }
        case "done": {
          message.stopReason = calls.length > 0 ? StopReason.TOOL_USE : STOP_BY_FINISH[chunk.finishReason];
          if (chunk.usage) {
            const u = chunk.usage;
            message.usage = create(UsageSchema, { inputTokens: u.inputTokens, outputTokens: u.outputTokens, cacheReadInputTokens: u.cacheReadInputTokens, totalTokens: u.inputTokens + u.outputTokens });
            host.emit({ case: "usage", value: { model: chunk.responseModel, usage: message.usage } });
            span.setAttributes({ [GenAI.USAGE_INPUT_TOKENS]: u.inputTokens, [GenAI.USAGE_OUTPUT_TOKENS]: u.outputTokens });
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
    message.toolCalls = calls.map((c, i) => create(ToolCallSchema, { id: c.id || `call_${id}_${i}`, name: c.name, argumentsJson: c.args }));
  } catch (err) {
    const e = err instanceof ModelError ? err : new ModelError(String((err as Error)?.message ?? err), false);
    // Partial tool calls are dropped: a call without its complete arguments must never run.
    message.stopReason = e.aborted ? StopReason.ABORTED : StopReason.ERROR;
    if (!e.aborted) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
      span.setAttribute(GenAI.ERROR_TYPE, e.status ? String(e.status) : "network");
      host.emit({ case: "error", value: { code: "MODEL_ERROR", message: e.message, retryable: e.retryable } });
    }
    return { message: endAssistant(host, message, text, thinking, span), errorMessage: e.aborted ? "" : e.message };
  }
  return { message: endAssistant(host, message, text, thinking, span), errorMessage: "" };
}

function endAssistant(host: RunHost, message: ChatMessage, text: string, thinking: string, span: ReturnType<typeof tracer.startSpan>): ChatMessage {
  message.text = text;
  message.thinking = thinking;
  message.time = timestampNow();
  host.emit({ case: "messageEnd", value: { message } });
  host.messages.push(message);
  span.end();
  return message;
}

function addUsage(total: Usage, u: Usage | undefined): void {
  if (!u) return;
  total.inputTokens += u.inputTokens;
  total.outputTokens += u.outputTokens;
  total.cacheReadInputTokens += u.cacheReadInputTokens;
  total.totalTokens += u.totalTokens;
}

/**
 * Runs the batch one call at a time. Before each call the steering queue is read: if a message
 * is waiting, this call and the rest are skipped with paired results, and the steering messages
 * are returned to be injected before the next model call. A call that is already running always
 * finishes (or is cancelled by an abort).
 */
async function executeToolCalls(host: RunHost, deps: RunDeps, assistant: ChatMessage): Promise<QueuedMessage[]> {
  const calls = assistant.toolCalls;
  for (let i = 0; i < calls.length; i++) {
    if (host.signal.aborted) {
      skipCalls(host, calls.slice(i), SKIPPED_BY_ABORT);
      return [];
    }
    const steering = host.takeSteering();
    if (steering.length > 0) {
      const skipped = calls.slice(i);
      host.emit({ case: "toolCallsSkipped", value: { frameId: steering[0].frameId, toolCallIds: skipped.map((c) => c.id) } });
      skipCalls(host, skipped, SKIPPED_BY_STEER);
      return steering;
    }
    if (assistant.stopReason === StopReason.LENGTH) {
      finishCall(host, calls[i], "The reply hit the output limit, so these arguments may be truncated; the call was not run.", true, false);
      continue;
    }
    await runToolCall(host, deps, calls[i]);
  }
  return host.takeSteering();
}

function skipCalls(host: RunHost, calls: readonly ToolCall[], reason: string): void {
  for (const call of calls) {
    host.emit({ case: "toolExecutionStart", value: { toolCallId: call.id, toolName: call.name, argumentsJson: call.argumentsJson } });
    finishCall(host, call, reason, true, true);
  }
}

function finishCall(host: RunHost, call: ToolCall, output: string, isError: boolean, skipped: boolean): void {
  host.emit({ case: "toolExecutionEnd", value: { toolCallId: call.id, toolName: call.name, result: output, isError, skipped } });
  pushMessage(
    host,
    create(ChatMessageSchema, { id: newId(), role: Role.TOOL, toolCallId: call.id, toolName: call.name, text: output, isError, time: timestampNow() }),
  );
}

async function runToolCall(host: RunHost, deps: RunDeps, call: ToolCall): Promise<void> {
  const tool = deps.tools.find((t) => t.name === call.name);
  host.emit({ case: "toolExecutionStart", value: { toolCallId: call.id, toolName: call.name, argumentsJson: call.argumentsJson } });
  const span = tracer.startSpan(`execute_tool ${call.name}`, {
    kind: SpanKind.INTERNAL,
    attributes: {
      [GenAI.OPERATION_NAME]: "execute_tool",
      [GenAI.TOOL_NAME]: call.name,
      [GenAI.TOOL_CALL_ID]: call.id,
      [GenAI.TOOL_TYPE]: "function",
      ...(tool ? { [GenAI.TOOL_DESCRIPTION]: tool.description } : {}),
    },
  });
  let output: string;
  let isError: boolean;
  try {
    if (!tool) throw new ToolInputError(`Tool ${call.name} not found. Available tools: ${deps.tools.map((t) => t.name).join(", ") || "none"}.`);
    let args: unknown;
    try {
      args = call.argumentsJson.trim() === "" ? {} : JSON.parse(call.argumentsJson);
    } catch (err) {
      throw new ToolInputError(`Invalid JSON in the arguments of ${call.name}: ${(err as Error).message}. Received: ${call.argumentsJson.slice(0, 500)}`);
    }
    if (typeof args !== "object" || args === null || Array.isArray(args)) throw new ToolInputError(`The arguments of ${call.name} must be a JSON object.`);
    const result = await context.with(trace.setSpan(context.active(), span), () =>
      tool.execute(args as Record<string, unknown>, {
        sessionId: host.sessionId,
        agentId: deps.agentId,
        toolCallId: call.id,
        signal: host.signal,
        onUpdate: (chunk) => host.emit({ case: "toolExecutionUpdate", value: { toolCallId: call.id, toolName: call.name, output: chunk } }),
      }),
    );
    output = result.output;
    isError = result.isError;
  } catch (err) {
    // Tools throw to report failure; the model sees the message and can correct itself.
    output = err instanceof ToolInputError ? err.message : `Tool ${call.name} failed: ${(err as Error)?.message ?? String(err)}`;
    isError = true;
  }
  if (isError) span.setStatus({ code: SpanStatusCode.ERROR });
  span.end();
  finishCall(host, call, output, isError, false);
}

class ToolInputError extends Error {}
