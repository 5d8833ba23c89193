// The agent loop: one run, from the message that starts it to agent_end.
//
//   screen the starting messages (safety checks; a blocked one never enters)
//   resolve the model chain and build the system prompt (turn-start.ts, context.ts)
//   outer loop (follow-ups):
//     inner loop (steps):
//       inject pending user messages
//       fit the conversation to the window, compacting when it would not fit (transcript.ts)
//       stream the assistant's reply, with retries and fallbacks  -> chat span
//       run its tool calls: validated, hooked, parallel where the   -> execute_tool spans
//         tools allow; before each group, look for steering: if some arrived, the rest of the
//         batch is skipped (paired results say so) and the steering goes in before the next call;
//         a group with a call the approval policy holds stops the run here (RunWaiting): it
//         goes on as a resume once the held calls are decided
//     when the model stops asking for tools, take the follow-ups queued meanwhile
//
// Side effects come in through RunHost (events, queues, the abort signal) and RunDeps (model,
// tools, prompt, hooks); the loop itself holds no state between runs.
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import {
  ChatMessageSchema,
  Role,
  StopReason,
  UsageSchema,
  type ChatMessage,
  type Usage,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { triggerOf } from "../../shared/frames.js";
import { newId } from "../../shared/ids.js";
import { withLogFields } from "../../shared/process/log.js";
import { instruments } from "../../shared/process/metrics.js";
import { GenAI, tracer } from "../../shared/process/telemetry.js";
import type { TurnInfo } from "./hooks.js";
import {
  hookFailed,
  pushMessage,
  report,
  unansweredCalls,
  type QueuedMessage,
  type RunDeps,
  type RunHost,
  type RunOutcome,
} from "./run.js";
import { callModel, addUsage } from "./model-call.js";
import { executeToolCalls } from "./tool-calls.js";
import { refreshSystem, startTurn, type Resume } from "./turn-start.js";

/**
 * Runs the agent for the messages that start the run (usually one; several in collect mode), or,
 * with `resume`, goes on with a run its runner died in from its last complete step.
 */
export async function runAgent(
  host: RunHost,
  deps: RunDeps,
  initial: QueuedMessage[],
  resume?: Resume,
): Promise<RunOutcome> {
  const info: TurnInfo = { sessionId: host.sessionId, agentId: deps.agentId, sender: deps.sender };
  // A blocked message never enters the run or the history; with nothing left, there is no run.
  const admitted = resume ? [] : await admit(host, deps, info, initial);
  if (!resume && admitted.length === 0) return { stopReason: StopReason.COMPLETED, errorMessage: "" };
  const first = admitted[0];
  // The last error event's code is what a failed run is counted under.
  let lastError = "";
  const emit = host.emit;
  host = {
    ...host,
    emit: (p) => {
      if (p.case === "error") lastError = p.value.code ?? "";
      emit(p);
    },
  };
  const counted = { "gen_ai.agent.id": deps.agentId, tenant: deps.tenant };
  instruments().turns.add(1, { ...counted, "troupe.turn.phase": resume ? "resumed" : "started" });
  const span = tracer.startSpan(
    `invoke_agent ${deps.agentId}`,
    {
      kind: SpanKind.INTERNAL,
      attributes: {
        [GenAI.OPERATION_NAME]: "invoke_agent",
        [GenAI.PROVIDER_NAME]: deps.model.providerOf(deps.defaultModel),
        [GenAI.AGENT_ID]: deps.agentId,
        [GenAI.AGENT_NAME]: deps.agentId,
        [GenAI.CONVERSATION_ID]: host.sessionId,
      },
    },
    first?.traceContext ?? ROOT_CONTEXT,
  );
  const usage = create(UsageSchema);
  const startedAt = resume?.from ?? host.messages.length;
  let outcome: RunOutcome = { stopReason: StopReason.ERROR, errorMessage: "" };
  try {
    const turnContext = withLogFields(trace.setSpan(first?.traceContext ?? ROOT_CONTEXT, span), {
      tenant: deps.tenant,
      session_id: host.sessionId,
    });
    outcome = await context.with(turnContext, async () => {
      const ended = await runLoop(host, deps, info, admitted, usage, span, resume);
      deps.log.debug("run ended", {
        stop_reason: StopReason[ended.stopReason],
        input_tokens: usage.inputTokens,
        output_tokens: usage.outputTokens,
      });
      return ended;
    });
    span.setAttributes({
      [GenAI.USAGE_INPUT_TOKENS]: usage.inputTokens,
      [GenAI.USAGE_OUTPUT_TOKENS]: usage.outputTokens,
    });
    if (outcome.stopReason === StopReason.ERROR)
      span.setStatus({ code: SpanStatusCode.ERROR, message: outcome.errorMessage });
    // A waiting run has not ended: its resume sends agent_end (or the wait's abort does).
    if (outcome.waiting) return { ...outcome, waiting: { from: startedAt } };
    host.emit({
      case: "agentEnd",
      value: { stopReason: outcome.stopReason, errorMessage: outcome.errorMessage, usage },
    });
    // A heartbeat that found nothing to say leaves no trace in the history (nor in memory).
    if (outcome.stopReason === StopReason.COMPLETED && saidNothing(host.messages, startedAt, first)) {
      host.elide(host.messages.slice(startedAt).map((m) => m.id));
    } else if (outcome.stopReason === StopReason.COMPLETED && deps.afterRun) {
      const exchange = host.messages
        .slice(startedAt)
        .filter((m) => (m.role === Role.USER || m.role === Role.ASSISTANT) && m.text.trim() !== "")
        .map((m) => ({
          role: m.role === Role.USER ? ("user" as const) : ("assistant" as const),
          text: m.text,
          speaker: m.speaker?.id,
        }));
      if (exchange.length > 0) deps.afterRun(host.sessionId, exchange, span.spanContext());
    }
    return outcome;
  } finally {
    span.end();
    const phase = outcome.waiting
      ? "waiting"
      : outcome.stopReason === StopReason.ABORTED
        ? "aborted"
        : outcome.stopReason === StopReason.ERROR
          ? "failed"
          : "completed";
    instruments().turns.add(1, {
      ...counted,
      "troupe.turn.phase": phase,
      ...(phase === "failed" ? { "error.type": lastError || "UNKNOWN" } : {}),
    });
    if (!outcome.waiting)
      deps.hooks.observe(
        "agent_end",
        { ...info, stopReason: StopReason[outcome.stopReason] ?? "ERROR", errorMessage: outcome.errorMessage },
        hookFailed(host),
      );
  }
}

/** Safety checks, then the message_received hooks, for messages about to enter the run. */
async function admit(host: RunHost, deps: RunDeps, info: TurnInfo, queued: QueuedMessage[]): Promise<QueuedMessage[]> {
  const passed: QueuedMessage[] = [];
  for (const q of queued) {
    const blocked = deps.screen ? await deps.screen(q) : undefined;
    if (blocked) {
      host.emit({
        case: "messageBlocked",
        value: { frameId: q.frameId, check: blocked.check, level: blocked.level, reason: blocked.reason },
      });
      continue;
    }
    deps.hooks.observe("message_received", { ...info, frameId: q.frameId, text: q.text }, hookFailed(host));
    if (q.attachments?.length) await deps.placeFiles?.(q);
    passed.push(q);
  }
  return passed;
}

/** The reply a heartbeat gives when nothing needs attention (schedules.ts DEFAULT_HEARTBEAT_TEXT). */
const HEARTBEAT_OK = /^\s*HEARTBEAT_OK[\s.!]*$/;

/** A heartbeat's run whose only answer was HEARTBEAT_OK. */
function saidNothing(messages: readonly ChatMessage[], from: number, first: QueuedMessage | undefined): boolean {
  if (!first || !triggerOf(first.frameId).startsWith("heartbeat:")) return false;
  const answers = messages.slice(from).filter((m) => m.role === Role.ASSISTANT);
  return answers.length > 0 && HEARTBEAT_OK.test(answers[answers.length - 1].text);
}

async function runLoop(
  host: RunHost,
  deps: RunDeps,
  info: TurnInfo,
  initial: QueuedMessage[],
  usage: Usage,
  span: ReturnType<typeof tracer.startSpan>,
  resume?: Resume,
): Promise<RunOutcome> {
  const turn = await startTurn(host, deps, info, initial, usage, resume);
  span.setAttribute(GenAI.REQUEST_MODEL, turn.models[0]);
  let pending: QueuedMessage[] = initial;
  let step = 0;
  // A resumed run first runs the calls of its last step that never started: held for a decision
  // (now decided, or skipped by steering), or behind one, or cut off before their turn.
  const unstarted = resume ? unansweredCalls(host.messages) : [];
  if (unstarted.length > 0) {
    step++;
    host.emit({ case: "turnStart", value: { step } });
    const asked = host.messages.findLast((m) => m.toolCalls.some((c) => c.id === unstarted[0].id))!;
    const done = await executeToolCalls(turn, { ...asked, toolCalls: unstarted });
    host.emit({ case: "turnEnd", value: { step, stopReason: asked.stopReason } });
    if (done.waiting) return waitOn(host, done.waiting);
    pending = await admit(host, deps, info, done.steering);
    if (host.signal.aborted) {
      injectUserMessages(host, pending);
      return { stopReason: StopReason.ABORTED, errorMessage: "" };
    }
  }
  for (;;) {
    for (;;) {
      step++;
      host.emit({ case: "turnStart", value: { step } });
      // Steering or follow-ups change the question: memories are recalled for it and the time is
      // now's (the first step's prompt was built for the messages that started the run).
      if (step > 1 && pending.length > 0 && !host.signal.aborted) await refreshSystem(turn, pending);
      // Messages taken from the queues always reach the history, even when the run is aborted
      // before it could answer them: an acknowledged message is never dropped.
      injectUserMessages(host, pending);
      pending = [];
      if (host.signal.aborted) {
        host.emit({ case: "turnEnd", value: { step, stopReason: StopReason.ABORTED } });
        return { stopReason: StopReason.ABORTED, errorMessage: "" };
      }
      // A run that would pass its tenant's quota of model calls ends here, saying so.
      if (turn.budget.steps-- <= 0) {
        const message = `this run reached its quota of ${step - 1} model calls (stepsPerRun); send a new message to go on`;
        report(host, "RUN_QUOTA", message);
        host.emit({ case: "turnEnd", value: { step, stopReason: StopReason.ERROR } });
        return { stopReason: StopReason.ERROR, errorMessage: message };
      }
      const { message: assistant, errorMessage } = await callModel(turn);
      addUsage(usage, assistant.usage);
      const calls = assistant.toolCalls;
      if (assistant.stopReason === StopReason.ERROR || assistant.stopReason === StopReason.ABORTED) {
        host.emit({ case: "turnEnd", value: { step, stopReason: assistant.stopReason } });
        return { stopReason: assistant.stopReason, errorMessage };
      }
      const done = calls.length > 0 ? await executeToolCalls(turn, assistant) : { steering: [] };
      host.emit({ case: "turnEnd", value: { step, stopReason: assistant.stopReason } });
      if (done.waiting) return waitOn(host, done.waiting);
      pending = await admit(host, deps, info, done.steering);
      if (host.signal.aborted) {
        injectUserMessages(host, pending); // steering taken during the batch, kept (see above)
        return { stopReason: StopReason.ABORTED, errorMessage: "" };
      }
      if (calls.length === 0) {
        // Steering that arrived while the final answer streamed gets its own step.
        pending = await admit(host, deps, info, host.takeSteering());
        if (pending.length === 0) {
          if (assistant.stopReason === StopReason.LENGTH) return { stopReason: StopReason.LENGTH, errorMessage: "" };
          break;
        }
      }
    }
    pending = await admit(host, deps, info, host.takeFollowUps());
    if (pending.length === 0) return { stopReason: StopReason.COMPLETED, errorMessage: "" };
  }
}

/** The run stops to wait on decisions about these calls; it has not ended (runAgent sends no agent_end). */
function waitOn(host: RunHost, toolCallIds: string[]): RunOutcome {
  host.emit({ case: "runWaiting", value: { toolCallIds } });
  return { stopReason: StopReason.UNSPECIFIED, errorMessage: "", waiting: { from: 0 } };
}

/** Puts user messages into the conversation, each announced as applied. Also used by recovery. */
export function injectUserMessages(host: Pick<RunHost, "emit" | "messages">, queued: readonly QueuedMessage[]): void {
  for (const q of queued) {
    host.emit({ case: "queueApplied", value: { frameId: q.frameId, kind: q.kind } });
    const message = create(ChatMessageSchema, {
      id: newId(),
      role: Role.USER,
      text: q.text,
      frameId: q.frameId,
      time: timestampNow(),
      speaker: q.speaker,
      images: q.images ?? [],
    });
    pushMessage(host, message);
  }
}
