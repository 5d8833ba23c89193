// What a run is given and gives back: the host (events, queues, the abort signal), its
// dependencies (model, tools, prompt, hooks), the messages that start it, its outcome; and the
// turn every part of a run shares once it has started (loop.ts, model-call.ts, tool-calls.ts,
// compaction.ts). Nothing here does I/O; the loop itself holds no state between runs.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import type { Context, SpanContext } from "@opentelemetry/api";
import {
  ChatMessageSchema,
  Role,
  type FrameKind,
  type StopReason,
  type AgentEventSchema,
  type ChatMessage,
  type Image,
  type Attachment,
  type ToolCall,
  type ToolDecided,
  type Usage,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { newId } from "../../shared/ids.js";
import type { AgentConfig } from "../agent-config.js";
import type { ContextWarning } from "./prompt-input.js";
import type { HookFailure, Hooks, TurnInfo } from "./hooks.js";
import type { ModelClient, ModelTool } from "../providers/model.js";
import type { SafetyVerdict } from "./safety.js";
import type { TokenCounter } from "./tokens.js";
import type { Tool, ToolResult } from "../tools/tools.js";
import type { ClientToolSpec } from "../tools/client-tools.js";
import type { Logger } from "../../shared/process/log.js";

export type EventPayload = NonNullable<MessageInitShape<typeof AgentEventSchema>["payload"]>;

/** A user message waiting to enter a run. */
export interface QueuedMessage {
  frameId: string;
  kind: FrameKind;
  text: string;
  /** A prompt's instruction for the run it starts (not kept in the history). */
  instruction?: string;
  /** A prompt's images, for vision models. */
  images?: Image[];
  /** A prompt's temperature and reply length for the run it starts, in place of the agent's. */
  sampling?: { temperature?: number; maxOutputTokens?: number };
  /** A prompt's files, for the session's workspace (RunDeps.placeFiles). */
  attachments?: Attachment[];
  /** A prompt's client tools, for the run it starts (tools/client-tools.ts). */
  clientTools?: ClientToolSpec[];
  /** Who sent it, when a channel said (Deliver); otherwise the session's principal. */
  speaker?: { id: string; displayName: string };
  /** Trace context of the frame that carried it. */
  traceContext: Context;
}

/** The session's latest compaction: the model sees `summary` in place of everything before the kept message. */
export interface Compaction {
  summary: string;
  firstKeptMessageId: string;
}

/**
 * What the loop is given by the session actor for one run. Every callback is called from the run's
 * own async flow, never concurrently with itself, and none may throw.
 */
export interface RunHost {
  readonly sessionId: string;
  /** The model chosen for the session; empty: the agent's. */
  readonly model: string;
  /** The reasoning effort chosen for the session; empty: the agent's. */
  readonly reasoningEffort: string;
  /** The first message of `messages` the model sees: the conversation's start after a reset. */
  readonly contextFrom: number;
  /** User and assistant messages before `messages[0]`: the actor let them go (the model no longer sees them). */
  readonly conversationBefore: number;
  /** Aborted when the run must stop (an abort, an interrupting prompt, the runner closing). */
  readonly signal: AbortSignal;
  /** The conversation the actor holds (from the latest compaction's cut or reset on; the log has all); the loop appends to it. */
  readonly messages: ChatMessage[];
  /** Publishes an event to the session's clients and log. Contract: never throws, never blocks. */
  emit(payload: EventPayload): void;
  /** Streamed text or thinking; consecutive deltas may be merged into one event. Contract: never throws. */
  delta(messageId: string, kind: "text" | "thinking", text: string): void;
  /** Pending while a subscriber's stream is full (backpressure); undefined when all can take more. Never rejects. */
  pressure(): Promise<void> | undefined;
  /** Removes and returns the steering waiting for this run (maybe none). Contract: never throws. */
  takeSteering(): QueuedMessage[];
  /** Removes and returns the follow-ups waiting to join this run (maybe none). Contract: never throws. */
  takeFollowUps(): QueuedMessage[];
  /** The latest compaction_end of the session, if any. Contract: never throws. */
  compaction(): Compaction | undefined;
  /** Takes these messages out of the history, durably (their events stay). Contract: never throws. */
  elide(messageIds: string[]): void;
  /** The client's tools this run offers beside the agent's (the session's and its prompt's). */
  readonly clientTools: readonly ClientToolSpec[];
  /** Whether this call is already held (its approval request or client call is out). Contract: never throws. */
  isHeld(toolCallId: string, kind: "approval" | "client"): boolean;
  /** The decision on a held call, once one came. Contract: never throws. */
  decisionOf(toolCallId: string): ToolDecided | undefined;
  /** The client's answer to a call of a client tool, once it came. Contract: never throws. */
  clientResultOf(toolCallId: string): ToolResult | undefined;
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
  /** Who asked `query`, when a channel said; else the run's own speaker. */
  speaker?: QueuedMessage["speaker"];
}

/**
 * What a run depends on (made per run by run-deps.ts). A callback that "may reject" may do so only
 * for a bug: the loop does not catch it, and the actor restarts the session from its log.
 * Model and tool failures are not rejections (they end runs, or become results, normally).
 */
export interface RunDeps {
  agentId: string;
  /** The session owner's tenant: what per-tenant metrics count under. */
  tenant: string;
  /** The session owner's principal: who may decide on the calls its runs hold (tools/approvals.ts). */
  principal: string;
  /** The runner's log; records made during the run carry its trace, tenant and session. */
  log: Logger;
  /** The runner's model, for agents whose agent.json names none. */
  defaultModel: string;
  model: ModelClient;
  tools: readonly Tool[];
  /** The tools of the agent's MCP servers for this run, and why a server offers none. May be absent. */
  externalTools?(agent: AgentConfig): Promise<{ tools: Tool[]; warnings: string[] }>;
  hooks: Hooks;
  /** Who speaks in this session (principal or channel identity), for hooks. */
  sender: string;
  /** A triggered run: the frame its schedule was made in (schedules.ts originOf); "" for others. */
  triggerOrigin(trigger: string): Promise<string>;
  /** The agent's settings, and why its file was not used if it was not. May reject (a bug). */
  agent(): Promise<{ config: AgentConfig; error?: string }>;
  /** The token counter for a model (loaded once per model). May reject (a bug). */
  tokens(model: string): Promise<TokenCounter>;
  /**
   * The system prompt for a run that answers `query` (may consult memory and the operator's files;
   * what it could not use comes back as warnings). Honours `signal`. May reject (a bug).
   */
  systemPrompt(
    request: PromptRequest,
    signal: AbortSignal,
  ): Promise<{ text: string; tokens: number; warnings: ContextWarning[] }>;
  /**
   * Safety checks of one inbound message and its instruction: a verdict when it must be blocked
   * (already audited). Never rejects: a failing check is a blocking verdict.
   */
  screen?(message: QueuedMessage): Promise<SafetyVerdict | undefined>;
  /** Writes a message's attachments into the session's workspace. Contract: never throws; a file not written is logged. */
  placeFiles?(message: QueuedMessage): Promise<void>;
  /**
   * Safety checks of a tool's result before the model sees it: the result to use (the same, or
   * behind a warning). Never rejects: a failing check is the implementation's to handle.
   */
  screenToolResult?(call: { id: string; name: string }, result: ToolResult): Promise<ToolResult>;
  /**
   * Called once a run completed, with what the user and the assistant said in it (learning from
   * the turn happens here). Contract: never throws, never blocks (the run has ended, the reply is out).
   */
  afterRun?(
    sessionId: string,
    exchange: { role: "user" | "assistant"; text: string; speaker?: string }[],
    /** The run's span: learning is traced on its own, linked to it. */
    turn?: SpanContext,
  ): void;
  /** The tenant's quotas for one run (quotas.ts); none: unbounded. Read once, at the run's start. Never throws. */
  runQuotas?(): { stepsPerRun: number; toolCallsPerRun: number };
}

export interface RunOutcome {
  stopReason: StopReason;
  errorMessage: string;
  /**
   * The run stopped to wait on decisions (RunWaiting) and has not ended: no agent_end was sent.
   * `from` is where its messages begin in RunHost.messages, for the resume that goes on with it.
   */
  waiting?: { from: number };
}

/** Marks the request as a summary for a compaction (the scripted model answers it by rule). */
export const SUMMARY_MARKER = "[troupe:summarize]";

/** Everything a run settles once, at its start. */
export interface Turn {
  host: RunHost;
  deps: RunDeps;
  info: TurnInfo;
  agent: AgentConfig;
  /** The model, then its fallbacks. */
  models: string[];
  /**
   * Where in `models` the next call starts: once a fallback answers, the run's later steps start
   * there instead of waiting out the failing model again on every step.
   */
  modelAt: number;
  tokens: TokenCounter;
  system: { text: string; tokens: number };
  tools: ModelTool[];
  /** What the system prompt was built from, to build it again when the question changes. */
  prompt: Omit<PromptRequest, "query" | "driftReminder" | "speaker">;
  /** Model calls and tool calls this run may still make (its tenant's quotas). */
  budget: { steps: number; toolCalls: number };
  /** System prompt + tool schemas: the part of every request that is not the conversation. */
  fixedTokens: number;
  usage: Usage;
}

/** Something went wrong that the run goes on past: the client sees it as an error event. */
export const report = (host: RunHost, code: string, message: string) =>
  host.emit({ case: "error", value: { code, message, retryable: false } });

export const hookFailed = (host: RunHost) => (f: HookFailure) =>
  report(host, "HOOK_ERROR", `hook ${f.hook} (${f.name}) failed: ${f.message}`);

/** At most `max` characters of `s`, marked when cut. */
export const excerpt = (s: string, max: number) => (s.length > max ? `${s.slice(0, max)} [...]` : s);

/** Complete messages are announced (message_start, message_end) and join the conversation. */
export function pushMessage(host: Pick<RunHost, "emit" | "messages">, message: ChatMessage): void {
  host.emit({ case: "messageStart", value: { message } });
  host.emit({ case: "messageEnd", value: { message } });
  host.messages.push(message);
}

/**
 * Every tool call in `messages` still without a result (of those in `only`, when given) gets
 * `text` as an error result; returns their ids.
 */
export function answerUnanswered(
  emit: (payload: EventPayload) => void,
  messages: ChatMessage[],
  text: string,
  only?: ReadonlySet<string>,
): string[] {
  const ids: string[] = [];
  for (const call of unansweredCalls(messages)) {
    if (only && !only.has(call.id)) continue;
    {
      const result = create(ChatMessageSchema, {
        id: newId(),
        role: Role.TOOL,
        toolCallId: call.id,
        toolName: call.name,
        text,
        isError: true,
        time: timestampNow(),
      });
      emit({
        case: "toolExecutionEnd",
        value: { toolCallId: call.id, toolName: call.name, result: result.text, isError: true },
      });
      emit({ case: "messageEnd", value: { message: result } });
      messages.push(result);
      ids.push(call.id);
    }
  }
  return ids;
}

/** The tool calls in `messages` that have no result yet, in order. */
export function unansweredCalls(messages: readonly ChatMessage[]): ToolCall[] {
  const answered = new Set(messages.filter((m) => m.role === Role.TOOL).map((m) => m.toolCallId));
  return messages.flatMap((m) => (m.role === Role.ASSISTANT ? m.toolCalls : [])).filter((c) => !answered.has(c.id));
}
