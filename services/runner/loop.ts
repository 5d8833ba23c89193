// The agent loop: one run, from the message that starts it to agent_end.
//
//   screen the starting messages (safety checks; a blocked one never enters)
//   resolve the model chain and build the system prompt (context.ts)
//   outer loop (follow-ups):
//     inner loop (steps):
//       inject pending user messages
//       fit the conversation to the window, compacting when it would not fit (transcript.ts)
//       stream the assistant's reply, with retries and fallbacks  -> chat span
//       run its tool calls: validated, hooked, parallel where the   -> execute_tool spans
//         tools allow; before each group, look for steering: if some arrived, the rest of the
//         batch is skipped (paired results say so) and the steering goes in before the next call
//     when the model stops asking for tools, take the follow-ups queued meanwhile
//
// Side effects come in through RunHost (events, queues, the abort signal) and RunDeps (model,
// tools, prompt, hooks); the loop itself holds no state between runs.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { SpanKind, SpanStatusCode, context, trace, type Context } from "@opentelemetry/api";
import { Ajv, type ValidateFunction } from "ajv";
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
import { triggerOf } from "../shared/frames.js";
import { newId } from "../shared/ids.js";
import { GenAI, tracer } from "../shared/telemetry.js";
import type { AgentConfig } from "./agent-config.js";
import { DRIFT_THRESHOLD, type ContextWarning } from "./context.js";
import type { HookFailure, Hooks, TurnInfo } from "./hooks.js";
import { ModelError, isContextOverflow, type FinishReason, type ModelClient, type ModelRequest, type ModelTool } from "./model.js";
import type { SafetyVerdict } from "./safety.js";
import type { TokenCounter } from "./tokens.js";
import type { Tool, ToolResult } from "./tools.js";
import { compactionCut, fitNewestFirst, sanitise, summaryMessage, toModelMessages } from "./transcript.js";

export type EventPayload = NonNullable<MessageInitShape<typeof AgentEventSchema>["payload"]>;

/** A user message waiting to enter a run. */
export interface QueuedMessage {
  frameId: string;
  kind: FrameKind;
  text: string;
  /** A prompt's instruction for the run it starts (not kept in the history). */
  instruction?: string;
  /** Trace context of the frame that carried it. */
  traceContext: Context;
}

/** The session's latest compaction: the model sees `summary` in place of everything before the kept message. */
export interface Compaction {
  summary: string;
  firstKeptMessageId: string;
}

export interface RunHost {
  readonly sessionId: string;
  readonly signal: AbortSignal;
  /** The conversation so far (all of it: compaction changes the model's view, not the record); the loop appends to it. */
  readonly messages: ChatMessage[];
  emit(payload: EventPayload): void;
  /** Streamed text or thinking; consecutive deltas may be merged into one event. */
  delta(messageId: string, kind: "text" | "thinking", text: string): void;
  /** Resolves when every subscriber can take more events (backpressure). */
  pressure(): Promise<void> | undefined;
  takeSteering(): QueuedMessage[];
  takeFollowUps(): QueuedMessage[];
  /** The latest compaction_end of the session, if any. */
  compaction(): Compaction | undefined;
}

/** What the run asks for its system prompt. */
export interface PromptRequest {
  query: string;
  agent: AgentConfig;
  ephemeral: string[];
  driftReminder: boolean;
  tokens: TokenCounter;
  /** Tokens the system prompt may use before optional sources are left out. */
  budget: number;
}

export interface RunDeps {
  agentId: string;
  /** The runner's model, for agents whose agent.json names none. */
  defaultModel: string;
  model: ModelClient;
  tools: readonly Tool[];
  hooks: Hooks;
  /** Who speaks in this session (principal or channel identity), for hooks. */
  sender: string;
  agent(): Promise<{ config: AgentConfig; error?: string }>;
  tokens(model: string): Promise<TokenCounter>;
  /** The system prompt for a run that answers `query` (may consult memory and the operator's files). */
  systemPrompt(request: PromptRequest, signal: AbortSignal): Promise<{ text: string; tokens: number; warnings: ContextWarning[] }>;
  /** Safety checks of one inbound message and its instruction: a verdict when it must be blocked (already audited). */
  screen?(message: QueuedMessage): Promise<SafetyVerdict | undefined>;
  /**
   * Safety checks of a tool's result before the model sees it: the result to use (the same, or
   * behind a warning). Must not throw: a failing check is the implementation's to handle.
   */
  screenToolResult?(call: { id: string; name: string }, result: ToolResult): Promise<ToolResult>;
  /**
   * Called once a run completed, with what the user and the assistant said in it (learning from
   * the turn happens here). It must not block: the run has ended and the reply is out.
   */
  afterRun?(sessionId: string, exchange: { role: "user" | "assistant"; text: string }[]): void;
  /** The tenant's quotas for one run (quotas.ts); none: unbounded. Read once, at the run's start. */
  runQuotas?(): { stepsPerRun: number; toolCallsPerRun: number };
}

export interface RunOutcome {
  stopReason: StopReason;
  errorMessage: string;
}

const SKIPPED_BY_STEER = "Skipped due to queued user message.";
const SKIPPED_BY_ABORT = "Not run: the run was aborted.";
/** The shortest reply a request may leave room for; below it, the context is cut further. */
const MIN_REPLY_TOKENS = 256;
/** A summary has this much room to be written in. */
const SUMMARY_MAX_TOKENS = 2048;
const SUMMARY_TIMEOUT_MS = 120_000;
/** Marks the request as a summary for a compaction (the scripted model answers it by rule). */
export const SUMMARY_MARKER = "[troupe:summarize]";

/** Everything a run settles once, at its start. */
interface Turn {
  host: RunHost;
  deps: RunDeps;
  info: TurnInfo;
  agent: AgentConfig;
  /** The model, then its fallbacks. */
  models: string[];
  tokens: TokenCounter;
  system: { text: string; tokens: number };
  tools: ModelTool[];
  /** Model calls and tool calls this run may still make (its tenant's quotas). */
  budget: { steps: number; toolCalls: number };
  /** System prompt + tool schemas: the part of every request that is not the conversation. */
  fixedTokens: number;
  usage: Usage;
}

/** Runs the agent for the messages that start the run (usually one; several in collect mode). */
export async function runAgent(host: RunHost, deps: RunDeps, initial: QueuedMessage[]): Promise<RunOutcome> {
  const info: TurnInfo = { sessionId: host.sessionId, agentId: deps.agentId, sender: deps.sender };
  // A blocked message never enters the run or the history; with nothing left, there is no run.
  const admitted = await admit(host, deps, info, initial);
  if (admitted.length === 0) return { stopReason: StopReason.COMPLETED, errorMessage: "" };
  const first = admitted[0];
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
      },
    },
    first.traceContext,
  );
  const usage = create(UsageSchema);
  const startedAt = host.messages.length;
  let outcome: RunOutcome = { stopReason: StopReason.ERROR, errorMessage: "" };
  try {
    outcome = await context.with(trace.setSpan(first.traceContext, span), () => runLoop(host, deps, info, admitted, usage, span));
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
    deps.hooks.observe("agent_end", { ...info, stopReason: StopReason[outcome.stopReason] ?? "ERROR", errorMessage: outcome.errorMessage }, hookFailed(host));
  }
}

/** Safety checks, then the message_received hooks, for messages about to enter the run. */
async function admit(host: RunHost, deps: RunDeps, info: TurnInfo, queued: QueuedMessage[]): Promise<QueuedMessage[]> {
  const passed: QueuedMessage[] = [];
  for (const q of queued) {
    const blocked = deps.screen ? await deps.screen(q) : undefined;
    if (blocked) {
      host.emit({ case: "messageBlocked", value: { frameId: q.frameId, check: blocked.check, level: blocked.level, reason: blocked.reason } });
      continue;
    }
    deps.hooks.observe("message_received", { ...info, frameId: q.frameId, text: q.text }, hookFailed(host));
    passed.push(q);
  }
  return passed;
}

/** Something went wrong that the run goes on past: the client sees it as an error event. */
const report = (host: RunHost, code: string, message: string) => host.emit({ case: "error", value: { code, message, retryable: false } });

const hookFailed = (host: RunHost) => (f: HookFailure) => report(host, "HOOK_ERROR", `hook ${f.hook} (${f.name}) failed: ${f.message}`);

/** At most `max` characters of `s`, marked when cut. */
const excerpt = (s: string, max: number) => (s.length > max ? `${s.slice(0, max)} [...]` : s);

async function startTurn(host: RunHost, deps: RunDeps, info: TurnInfo, initial: readonly QueuedMessage[], usage: Usage): Promise<Turn> {
  const query = initial.map((q) => q.text).join("\n");
  // The model is settled before agent_start, which names it; what went wrong on the way follows it.
  const { config: agent, error } = await deps.agent();
  const resolved = await deps.hooks.modify("before_model_resolve", { ...info, model: agent.model || deps.defaultModel }, (p, r) => ({ payload: r.model ? { ...p, model: r.model } : p }));
  const models = [...new Set([resolved.payload.model, ...agent.fallbacks])];
  host.emit({ case: "agentStart", value: { agentId: deps.agentId, model: models[0], frameId: initial[0].frameId, trigger: triggerOf(initial[0].frameId) } });
  if (error) report(host, "AGENT_CONFIG", error);
  resolved.failures.forEach(hookFailed(host));
  failpoint("runner.run", query);
  const extra = initial.map((q) => q.instruction ?? "").filter((s) => s.trim() !== "");
  const built = await deps.hooks.modify("before_prompt_build", { ...info, query }, (p, r) => {
    if (typeof r.instruction === "string" && r.instruction.trim() !== "") extra.push(r.instruction);
    return { payload: p };
  });
  built.failures.forEach(hookFailed(host));
  const tokens = await deps.tokens(models[0]);
  const tools = deps.tools.map(({ name, description, parameters }) => ({ name, description, parameters }));
  const toolTokens = tools.length === 0 ? 0 : tokens.recurringText(JSON.stringify(tools));
  const conversation = host.messages.filter((m) => m.role === Role.USER || m.role === Role.ASSISTANT).length;
  // The system prompt may take up to half of what the window leaves for the request.
  const budget = Math.max(256, Math.floor((agent.contextWindow - agent.reserveTokens - toolTokens) / 2));
  const system = await deps.systemPrompt({ query, agent, ephemeral: extra, driftReminder: conversation >= DRIFT_THRESHOLD, tokens, budget }, host.signal);
  for (const w of system.warnings) report(host, w.code, w.message);
  const q = deps.runQuotas?.();
  const allowed = { steps: q?.stepsPerRun ?? Number.POSITIVE_INFINITY, toolCalls: q?.toolCallsPerRun ?? Number.POSITIVE_INFINITY };
  return { host, deps, info, agent, models, tokens, system, tools, budget: allowed, fixedTokens: system.tokens + toolTokens, usage };
}

async function runLoop(host: RunHost, deps: RunDeps, info: TurnInfo, initial: QueuedMessage[], usage: Usage, span: ReturnType<typeof tracer.startSpan>): Promise<RunOutcome> {
  const turn = await startTurn(host, deps, info, initial, usage);
  span.setAttribute(GenAI.REQUEST_MODEL, turn.models[0]);
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
      pending = calls.length > 0 ? await admit(host, deps, info, await executeToolCalls(turn, assistant)) : [];
      host.emit({ case: "turnEnd", value: { step, stopReason: assistant.stopReason } });
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

// -------------------------------------------------------------------------------------------
// The conversation as the model sees it, and compaction

/** The messages after the latest compaction's cut, sanitised. */
function conversationView(host: RunHost): { summary?: string; messages: ChatMessage[] } {
  const c = host.compaction();
  let from = 0;
  if (c) {
    const i = host.messages.findIndex((m) => m.id === c.firstKeptMessageId);
    if (i >= 0) from = i;
  }
  return { summary: c?.summary, messages: sanitise(from === 0 ? host.messages : host.messages.slice(from)).messages };
}

function viewTokens(turn: Turn, view: { summary?: string; messages: ChatMessage[] }): number {
  // The summary comes back unchanged in every request until the next compaction.
  let n = turn.fixedTokens + (view.summary ? turn.tokens.recurringText(summaryMessage(view.summary).content as string) + 4 : 0);
  for (const m of view.messages) n += turn.tokens.message(m);
  return n;
}

/**
 * The next request: the view of the conversation, compacted first when it would pass the window
 * minus the reserve, then fitted newest-first; max_tokens is what the window leaves.
 */
async function buildRequest(turn: Turn, model: string): Promise<{ request: ModelRequest; promptTokens: number }> {
  const { agent } = turn;
  const limit = agent.contextWindow - agent.reserveTokens;
  let view = conversationView(turn.host);
  let promptTokens = viewTokens(turn, view);
  if (promptTokens > limit && (await compact(turn, "threshold", promptTokens))) {
    view = conversationView(turn.host);
    promptTokens = viewTokens(turn, view);
  }
  if (promptTokens > limit) {
    // Still too long (one huge block, or a summary that could not shrink it): oldest blocks go.
    const fixed = promptTokens - view.messages.reduce((n, m) => n + turn.tokens.message(m), 0);
    const from = fitNewestFirst(view.messages, Math.max(0, limit - fixed), turn.tokens);
    view = { summary: view.summary, messages: view.messages.slice(Math.min(from, Math.max(0, view.messages.length - 1))) };
    promptTokens = viewTokens(turn, view);
  }
  const maxTokens = Math.max(MIN_REPLY_TOKENS, Math.min(agent.maxOutputTokens, agent.contextWindow - promptTokens));
  return { request: { model, messages: toModelMessages(turn.system.text, view.summary, view.messages), tools: turn.tools, maxTokens }, promptTokens };
}

/**
 * Summarises the older part of the conversation view and keeps the recent part verbatim (at
 * least keepRecentTokens, cut only between blocks). False when there is nothing older to fold.
 */
async function compact(turn: Turn, reason: "threshold" | "overflow", tokensBefore: number): Promise<boolean> {
  const { host } = turn;
  const view = conversationView(host);
  const cut = compactionCut(view.messages, turn.agent.keepRecentTokens, turn.tokens);
  if (cut === undefined) return false;
  host.emit({ case: "compactionStart", value: { reason, tokensBefore } });
  const older = view.messages.slice(0, cut);
  let summary: string;
  let error = "";
  try {
    summary = await summarise(turn, view.summary, older);
  } catch (err) {
    error = err instanceof ModelError && err.aborted ? "the run was aborted" : String((err as Error)?.message ?? err);
    summary = metadataSummary(view.summary, older);
  }
  const after = viewTokens(turn, { summary, messages: view.messages.slice(cut) });
  host.emit({
    case: "compactionEnd",
    value: { summary, firstKeptMessageId: view.messages[cut].id, messagesSummarized: older.length, tokensBefore, tokensAfter: after, fallback: error !== "", error },
  });
  return true;
}

function transcriptOf(messages: readonly ChatMessage[]): string {
  const clip = (s: string) => excerpt(s, 2000);
  const lines: string[] = [];
  for (const m of messages) {
    if (m.role === Role.USER) lines.push(`user: ${clip(m.text)}`);
    else if (m.role === Role.ASSISTANT) {
      if (m.text) lines.push(`assistant: ${clip(m.text)}`);
      for (const c of m.toolCalls) lines.push(`assistant called ${c.name}(${clip(c.argumentsJson)})`);
    } else if (m.role === Role.TOOL) lines.push(`${m.toolName} result${m.isError ? " (error)" : ""}: ${clip(m.text)}`);
  }
  return lines.join("\n");
}

/** The model writes the structured summary; throws when it cannot. */
async function summarise(turn: Turn, previous: string | undefined, older: readonly ChatMessage[]): Promise<string> {
  const system = [
    SUMMARY_MARKER,
    "You compact a conversation so that it can go on in a limited context window. Summarise the conversation below,",
    "merging the earlier summary if one is given. Use exactly these sections, in this order:",
    "## Goal\n## Constraints\n## Progress\n## Decisions\n## Next steps",
    "Keep names, paths, numbers, commands and open questions exactly. Write nothing but the summary.",
  ].join("\n");
  const user = `${previous ? `Earlier summary:\n${previous}\n\n` : ""}Conversation to summarise:\n${transcriptOf(older)}`;
  const signal = AbortSignal.any([turn.host.signal, AbortSignal.timeout(SUMMARY_TIMEOUT_MS)]);
  let text = "";
  for await (const chunk of turn.deps.model.stream({ model: turn.models[0], messages: [{ role: "system", content: system }, { role: "user", content: user }], tools: [], maxTokens: SUMMARY_MAX_TOKENS }, signal)) {
    if (chunk.type === "text") text += chunk.delta;
  }
  if (text.trim() === "") throw new Error("the model returned an empty summary");
  return text.trim();
}

/** When the model cannot summarise: what is known without it, so the turn can go on. */
export function metadataSummary(previous: string | undefined, older: readonly ChatMessage[]): string {
  const count = (r: Role) => older.filter((m) => m.role === r).length;
  const toolUses = new Map<string, number>();
  for (const m of older) for (const c of m.toolCalls) toolUses.set(c.name, (toolUses.get(c.name) ?? 0) + 1);
  const firstUser = older.find((m) => m.role === Role.USER)?.text ?? "";
  const lastUser = [...older].reverse().find((m) => m.role === Role.USER)?.text ?? "";
  return [
    "## Goal",
    excerpt(firstUser, 300) || "(unknown)",
    "## Constraints",
    "(not recorded: this summary was made without the model)",
    "## Progress",
    `${older.length} earlier messages were folded (${count(Role.USER)} from the user, ${count(Role.ASSISTANT)} from the assistant, ${count(Role.TOOL)} tool results).`,
    toolUses.size > 0 ? `Tools used: ${[...toolUses].map(([n, k]) => `${n} ×${k}`).join(", ")}.` : "No tools were used.",
    lastUser && lastUser !== firstUser ? `The last folded request was: ${excerpt(lastUser, 300)}` : "",
    previous ? `An earlier summary said:\n${previous}` : "",
    "## Decisions",
    "(not recorded)",
    "## Next steps",
    "Continue from the recent messages that follow.",
  ]
    .filter((s) => s !== "")
    .join("\n");
}

// -------------------------------------------------------------------------------------------
// Model calls: retries, fallbacks, overflow

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

/** Errors another model may not have: rate limits, overload, outages, auth, a model not served. */
const fallbackWorthy = (e: ModelError) => e.retryable || e.status === 401 || e.status === 403 || e.status === 404;

/**
 * One model call of the run. A failure that sent nothing to the client is retried (retryable
 * errors, with backoff, Retry-After honoured up to the policy's limit), then handed to the next
 * model of the chain; an overflow compacts the context and tries once more. Once output reached
 * the client, a failure ends the call: a retry would show it a different reply over the first.
 */
async function callModel(turn: Turn): Promise<{ message: ChatMessage; errorMessage: string }> {
  const { host, agent } = turn;
  let chain = 0;
  let retries = 0;
  let compacted = false;
  for (;;) {
    const model = turn.models[chain];
    const { request, promptTokens } = await buildRequest(turn, model);
    const attempt = await streamAssistant(turn, request, retries > 0 || chain > 0);
    if (!attempt.failure) return { message: attempt.message!, errorMessage: "" };
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
          host.emit({ case: "modelRetry", value: { model, attempt: retries, delayMs: delay, reason: e.message, httpStatus: e.status ?? 0 } });
          await sleep(delay, host.signal);
          if (!host.signal.aborted) continue;
        }
      }
      if (fallbackWorthy(e) && chain + 1 < turn.models.length && !host.signal.aborted) {
        chain++;
        retries = 0;
        host.emit({ case: "modelFallback", value: { fromModel: model, toModel: turn.models[chain], reason: e.message } });
        continue;
      }
    }
    return { message: failedAssistant(turn, model, attempt, e), errorMessage: e.aborted || host.signal.aborted ? "" : e.message };
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
  const message = create(ChatMessageSchema, { id, role: Role.ASSISTANT, model, text, thinking, stopReason: aborted ? StopReason.ABORTED : StopReason.ERROR, time: timestampNow() });
  if (!attempt.outputSent) host.emit({ case: "messageStart", value: { message: { id, role: Role.ASSISTANT, model } } });
  if (!aborted) host.emit({ case: "error", value: { code: "MODEL_ERROR", message: e.message, retryable: e.retryable } });
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
      [GenAI.PROVIDER_NAME]: deps.model.providerName,
      [GenAI.REQUEST_MODEL]: request.model,
      [GenAI.REQUEST_STREAM]: true,
      [GenAI.REQUEST_MAX_TOKENS]: request.maxTokens ?? 0,
      [GenAI.CONVERSATION_ID]: host.sessionId,
      ...(isRetry ? { "troupe.model.retry": true } : {}),
    },
  });
  const started = performance.now();
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
            value: { messageId: id, delta: { case: "toolCall", value: { index: chunk.index, id: chunk.id ?? "", name: chunk.name ?? "", argumentsDelta: chunk.argumentsDelta } } },
          });
          break;
        }
        case "done": {
          span.setAttribute(GenAI.RESPONSE_TIME_TO_FIRST_CHUNK, (performance.now() - started) / 1000);
          opened();
          message.stopReason = calls.length > 0 ? StopReason.TOOL_USE : STOP_BY_FINISH[chunk.finishReason];
          if (chunk.finishReason === "other") {
            report(host, "MODEL_FINISH_REASON", `the model stopped for an unknown reason (finish_reason ${JSON.stringify(chunk.rawFinishReason)}); its reply is taken as complete`);
          }
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
    if (!e.aborted) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
      span.setAttribute(GenAI.ERROR_TYPE, e.status ? String(e.status) : "network");
    }
    span.end();
    attempt.failure = e;
    return attempt;
  }
  message.text = attempt.partial.text;
  message.thinking = attempt.partial.thinking;
  message.time = timestampNow();
  host.emit({ case: "messageEnd", value: { message } });
  host.messages.push(message);
  span.end();
  attempt.message = message;
  return attempt;
}

function addUsage(total: Usage, u: Usage | undefined): void {
  if (!u) return;
  total.inputTokens += u.inputTokens;
  total.outputTokens += u.outputTokens;
  total.cacheReadInputTokens += u.cacheReadInputTokens;
  total.totalTokens += u.totalTokens;
}

// -------------------------------------------------------------------------------------------
// Tool calls

/**
 * Runs the batch in the model's order. Consecutive calls of tools that declare themselves
 * parallel run together; any other call runs alone. Before each group the steering queue is read:
 * if a message is waiting, this group and the rest are skipped with paired results, and the
 * steering messages are returned to be injected before the next model call. A call that is
 * already running always finishes (or is cancelled by an abort).
 */
async function executeToolCalls(turn: Turn, assistant: ChatMessage): Promise<QueuedMessage[]> {
  const { host, deps } = turn;
  const calls = assistant.toolCalls;
  const parallel = (c: ToolCall) => deps.tools.find((t) => t.name === c.name)?.parallel === true;
  for (let i = 0; i < calls.length; ) {
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
      finishCall(host, calls[i], { output: "The reply hit the output limit, so these arguments may be truncated; the call was not run.", isError: true }, false);
      i++;
      continue;
    }
    if (turn.budget.toolCalls <= 0) {
      // Over the tenant's quota of tool calls for one run: the rest are answered, not run.
      skipCalls(host, calls.slice(i), "Not run: this run reached its quota of tool calls (toolCallsPerRun). Answer with what you have.");
      return host.takeSteering();
    }
    let end = i + 1;
    if (parallel(calls[i])) while (end < calls.length && parallel(calls[end]) && end - i < turn.budget.toolCalls) end++;
    const group = calls.slice(i, end);
    turn.budget.toolCalls -= group.length;
    const results = await Promise.all(
      group.map(async (call) => {
        const result = await runToolCall(turn, call);
        return deps.screenToolResult ? deps.screenToolResult(call, result) : result;
      }),
    );
    group.forEach((call, k) => finishCall(host, call, results[k], false));
    i = end;
  }
  return host.takeSteering();
}

function skipCalls(host: RunHost, calls: readonly ToolCall[], reason: string): void {
  for (const call of calls) {
    host.emit({ case: "toolExecutionStart", value: { toolCallId: call.id, toolName: call.name, argumentsJson: call.argumentsJson } });
    finishCall(host, call, { output: reason, isError: true }, true);
  }
}

function finishCall(host: RunHost, call: ToolCall, result: ToolResult, skipped: boolean): void {
  host.emit({ case: "toolExecutionEnd", value: { toolCallId: call.id, toolName: call.name, result: result.output, isError: result.isError, skipped } });
  pushMessage(
    host,
    create(ChatMessageSchema, { id: newId(), role: Role.TOOL, toolCallId: call.id, toolName: call.name, text: result.output, isError: result.isError, time: timestampNow() }),
  );
}

/** A call the model got wrong (unknown tool, bad JSON, arguments off the schema): it sees why and can correct. */
class ToolInputError extends Error {}

const ajv = new Ajv({ allErrors: true, strict: false });
/**
 * Compiled validators by schema text. Some tools are made anew for every run (the memory tools
 * and delegate_task carry the session's scope), so keying by the tool object would compile
 * their schemas again each run (0.7 ms each), and ajv keeps every schema object it compiled.
 */
const validators = new Map<string, ValidateFunction>();

/** The call's arguments, parsed and checked against the tool's schema. */
function parseArguments(tool: Tool, call: ToolCall): Record<string, unknown> {
  let args: unknown;
  try {
    args = call.argumentsJson.trim() === "" ? {} : JSON.parse(call.argumentsJson);
  } catch (err) {
    throw new ToolInputError(`Invalid JSON in the arguments of ${call.name}: ${(err as Error).message}. Received: ${call.argumentsJson.slice(0, 500)}`);
  }
  if (typeof args !== "object" || args === null || Array.isArray(args)) throw new ToolInputError(`The arguments of ${call.name} must be a JSON object. Received: ${call.argumentsJson.slice(0, 500)}`);
  const key = JSON.stringify(tool.parameters);
  let validate = validators.get(key);
  if (!validate) {
    validate = ajv.compile(tool.parameters);
    validators.set(key, validate);
  }
  if (!validate(args)) {
    const problems = (validate.errors ?? []).map((e) => `${e.instancePath || "(arguments)"}: ${e.message}${e.params && "additionalProperty" in e.params ? ` (${String(e.params.additionalProperty)})` : ""}`);
    throw new ToolInputError(`The arguments of ${call.name} do not match its schema:\n- ${problems.join("\n- ")}\nReceived: ${call.argumentsJson.slice(0, 500)}`);
  }
  return args as Record<string, unknown>;
}

/** One call: validated, passed by before_tool_call, executed, amended by after_tool_call. */
async function runToolCall(turn: Turn, call: ToolCall): Promise<ToolResult> {
  const { host, deps, info } = turn;
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
  let result: ToolResult;
  try {
    if (!tool) throw new ToolInputError(`Tool ${call.name} not found. Available tools: ${deps.tools.map((t) => t.name).join(", ") || "none"}.`);
    let args = parseArguments(tool, call);
    let blocked: string | undefined;
    const gate = await deps.hooks.modify(
      "before_tool_call",
      { ...info, toolCallId: call.id, toolName: call.name, args },
      (p, r) => {
        if (r.block) {
          blocked = r.reason || "no reason given";
          return { payload: p, stop: true };
        }
        return { payload: r.args && typeof r.args === "object" ? { ...p, args: r.args } : p };
      },
      { failClosed: true },
    );
    // A guard that cannot answer fails closed: the call does not run.
    if (gate.closedBy) blocked = `a before_tool_call hook (${gate.closedBy.name}) failed: ${gate.closedBy.message}`;
    if (blocked !== undefined) {
      result = { output: `Tool execution was blocked: ${blocked}`, isError: true };
    } else {
      if (gate.payload.args !== args) args = parseArguments(tool, { ...call, argumentsJson: JSON.stringify(gate.payload.args) });
      result = await context.with(trace.setSpan(context.active(), span), () =>
        tool.execute(args, {
          sessionId: host.sessionId,
          agentId: deps.agentId,
          toolCallId: call.id,
          signal: host.signal,
          onUpdate: (chunk) => host.emit({ case: "toolExecutionUpdate", value: { toolCallId: call.id, toolName: call.name, output: chunk } }),
        }),
      );
      const amended = await deps.hooks.modify("after_tool_call", { ...info, toolCallId: call.id, toolName: call.name, args, result }, (p, r) => ({
        payload: { ...p, result: { output: typeof r.output === "string" ? r.output : p.result.output, isError: typeof r.isError === "boolean" ? r.isError : p.result.isError } },
      }));
      amended.failures.forEach(hookFailed(host));
      result = amended.payload.result;
    }
  } catch (err) {
    // Tools throw to report failure; the model sees the message and can correct itself.
    if (err instanceof ToolInputError) {
      report(host, "INVALID_TOOL_CALL", err.message.split("\n")[0]);
      result = { output: err.message, isError: true };
    } else result = { output: `Tool ${call.name} failed: ${(err as Error)?.message ?? String(err)}`, isError: true };
  }
  if (result.isError) span.setStatus({ code: SpanStatusCode.ERROR });
  span.end();
  return result;
}
