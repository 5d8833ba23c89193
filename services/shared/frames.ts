// Validation of client frames, shared by the gateway (to fail fast at the edge) and the runner
// (which owns the session and must not trust its callers either).
import { createHash } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import {
  ClientFrameSchema,
  FrameKind,
  Role,
  ToolVerdict,
  type ChatMessage,
  type ClientFrame,
  type ClientTool,
  type Sampling,
  type ToolDecision,
} from "./gen/troupe/v1/session_pb.js";
import { failedPrecondition, invalidArgument } from "./errors.js";
import { isAgentId, isFrameId, isSessionId } from "./ids.js";
import { validateAttachments, validateImages } from "./media.js";

export const FRAME_KIND: Record<NonNullable<ClientFrame["kind"]["case"]>, FrameKind> = {
  open: FrameKind.OPEN,
  prompt: FrameKind.PROMPT,
  steer: FrameKind.STEER,
  followUp: FrameKind.FOLLOW_UP,
  abort: FrameKind.ABORT,
  toolDecision: FrameKind.TOOL_DECISION,
  clientToolResult: FrameKind.CLIENT_TOOL_RESULT,
};

/**
 * Messages that mean "stop", typed by a user into any chat. The gateway turns a message that is
 * exactly one of these into an abort, so it takes effect at once instead of waiting behind the
 * run it means to stop (and is never sent to the model).
 */
const STOP_COMMANDS = new Set(["/stop", "/kill", "!kill", "/abort"]);

/** The frame itself, or an abort with the same id when its text is a stop command. */
export function catchStopCommand(frame: ClientFrame): ClientFrame {
  const k = frame.kind;
  if (
    (k.case === "prompt" || k.case === "steer" || k.case === "followUp") &&
    STOP_COMMANDS.has(k.value.text.trim().toLowerCase())
  ) {
    return create(ClientFrameSchema, {
      frameId: frame.frameId,
      traceContext: frame.traceContext,
      kind: { case: "abort", value: { reason: `${k.value.text.trim()} typed as a message` } },
    });
  }
  return frame;
}

/** The frame with its decider named, for a tool decision: the gateway says who decided, from the caller's key. */
export function stampDecider(frame: ClientFrame, principal: string): ClientFrame {
  if (frame.kind.case === "toolDecision") frame.kind.value.decidedBy = principal;
  return frame;
}

/** Frame ids Troupe makes itself (schedules, sub-agents); a client may not use them. */
const RESERVED_FRAME_ID = /^(trigger|delegate):/;

/** The frame id of a schedule's firing: the session takes each firing once, whoever fires it. */
export const triggerFrameId = (kind: "schedule" | "heartbeat", scheduleId: string, dueMs: number): string =>
  `trigger:${kind}:${scheduleId}:${dueMs}`;

/** "schedule:<id>" or "heartbeat:<id>" for a frame triggerFrameId made, else "". */
export function triggerOf(frameId: string): string {
  const m = /^trigger:(schedule|heartbeat):([^:]+):/.exec(frameId);
  return m ? `${m[1]}:${m[2]}` : "";
}
/** The longest per-turn instruction a prompt may carry. */
export const MAX_INSTRUCTION_CHARS = 8000;

/**
 * Checks a frame; `opened` says whether the stream already carried its open frame. `fromClient`: the frame comes from outside (the gateway's callers), so Troupe's
 * own frame id prefixes are refused.
 */
export function validateFrame(
  frame: ClientFrame | undefined,
  opened: boolean,
  fromClient = false,
): asserts frame is ClientFrame {
  if (!frame) throw invalidArgument("the request carries no frame");
  if (!isFrameId(frame.frameId)) throw invalidArgument("frame_id must be 1-128 printable ASCII characters");
  if (fromClient && RESERVED_FRAME_ID.test(frame.frameId))
    throw invalidArgument(
      `frame_id ${JSON.stringify(frame.frameId)}: ids starting with "trigger:" or "delegate:" are reserved for Troupe`,
    );
  if (fromClient && frame.speaker)
    throw invalidArgument(
      `frame ${frame.frameId}: speaker is set by the gateway for channel messages (Deliver), never by a client`,
    );
  const kind = frame.kind;
  if (kind.case === undefined)
    throw invalidArgument(
      `frame ${frame.frameId} has no kind: set one of open, prompt, steer, follow_up, abort, tool_decision`,
    );
  if (!opened && kind.case !== "open")
    throw failedPrecondition(
      `frame ${frame.frameId} (${kind.case}) arrived before the session was opened: send an open frame first`,
    );
  if (opened && kind.case === "open")
    throw failedPrecondition(`frame ${frame.frameId}: this stream's session is already open`);
  switch (kind.case) {
    case "open":
      validateSessionRef(kind.value.sessionId, kind.value.agentId, true);
      validateModelName(kind.value.model);
      validateReasoningEffort(kind.value.reasoningEffort);
      validateClientTools(frame.frameId, kind.value.clientTools);
      validateHistory(frame.frameId, kind.value.history);
      break;
    case "prompt":
    case "steer":
    case "followUp":
      if (kind.value.text.trim() === "") throw invalidArgument(`frame ${frame.frameId}: text must not be empty`);
      if (kind.case === "prompt" && kind.value.instruction.length > MAX_INSTRUCTION_CHARS) {
        throw invalidArgument(
          `frame ${frame.frameId}: instruction must be at most ${MAX_INSTRUCTION_CHARS} characters`,
        );
      }
      if (kind.case === "prompt") {
        validateSampling(frame.frameId, kind.value.sampling);
        validateImages(kind.value.images);
        validateAttachments(kind.value.attachments);
        validateClientTools(frame.frameId, kind.value.clientTools);
      }
      break;
    case "abort":
      break;
    case "toolDecision":
      validateDecision(frame.frameId, kind.value, fromClient);
      break;
    case "clientToolResult":
      if (!TOOL_CALL_ID.test(kind.value.toolCallId))
        throw invalidArgument(`frame ${frame.frameId}: tool_call_id must be 1-256 printable ASCII characters`);
      if (kind.value.output.length > MAX_CLIENT_OUTPUT)
        throw invalidArgument(`frame ${frame.frameId}: output must be at most ${MAX_CLIENT_OUTPUT} characters`);
      break;
  }
}

const TOOL_CALL_ID = /^[\x21-\x7e]{1,256}$/;
function validateSampling(frameId: string, s: Sampling | undefined): void {
  if (s?.temperature !== undefined && !(s.temperature >= 0 && s.temperature <= 2))
    throw invalidArgument(`frame ${frameId}: sampling.temperature must be between 0 and 2`);
  if (s?.maxOutputTokens !== undefined && (s.maxOutputTokens < 1 || s.maxOutputTokens > 1_000_000))
    throw invalidArgument(`frame ${frameId}: sampling.max_output_tokens must be between 1 and 1000000`);
}

/** The most messages OpenSession.history may bring. */
export const MAX_HISTORY_MESSAGES = 500;

/**
 * A client's conversation for a new session (OpenSession.history): user messages with text or
 * images, assistant messages with text or tool calls, tool results naming the call they answer.
 */
export function validateHistory(frameId: string, history: readonly ChatMessage[]): void {
  if (history.length > MAX_HISTORY_MESSAGES)
    throw invalidArgument(`frame ${frameId}: history may hold at most ${MAX_HISTORY_MESSAGES} messages`);
  for (const [i, m] of history.entries()) {
    const at = `frame ${frameId}: history[${i}]`;
    if (m.role === Role.USER) {
      if (m.text.trim() === "" && m.images.length === 0)
        throw invalidArgument(`${at}: a user message needs text or images`);
      validateImages(m.images);
    } else if (m.role === Role.ASSISTANT) {
      if (m.text.trim() === "" && m.toolCalls.length === 0)
        throw invalidArgument(`${at}: an assistant message needs text or tool calls`);
      for (const c of m.toolCalls)
        if (!TOOL_CALL_ID.test(c.id) || !CLIENT_TOOL_NAME.test(c.name))
          throw invalidArgument(`${at}: a tool call needs an id (1-256 printable ASCII) and a function name`);
    } else if (m.role === Role.TOOL) {
      if (!TOOL_CALL_ID.test(m.toolCallId)) throw invalidArgument(`${at}: a tool message names the call it answers`);
    } else throw invalidArgument(`${at}: role must be user, assistant or tool`);
  }
}
const MAX_CLIENT_OUTPUT = 1 << 20;
/** What model APIs take as a function's name. */
const CLIENT_TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;
const MAX_CLIENT_TOOLS = 64;

/** Client tools as declared: names a model API takes, once each, schemas that are JSON objects of an object type. */
export function validateClientTools(frameId: string, tools: readonly ClientTool[]): void {
  if (tools.length > MAX_CLIENT_TOOLS)
    throw invalidArgument(`frame ${frameId}: at most ${MAX_CLIENT_TOOLS} client tools, not ${tools.length}`);
  const names = new Set<string>();
  for (const t of tools) {
    if (!CLIENT_TOOL_NAME.test(t.name))
      throw invalidArgument(
        `frame ${frameId}: client tool name ${JSON.stringify(t.name.slice(0, 80))} must be 1-64 of A-Z a-z 0-9 _ -`,
      );
    if (names.has(t.name)) throw invalidArgument(`frame ${frameId}: client tool ${t.name} is declared twice`);
    names.add(t.name);
    if (t.description.length > 8000)
      throw invalidArgument(`frame ${frameId}: client tool ${t.name}: description must be at most 8000 characters`);
    if (t.parametersJson.trim() === "") continue;
    if (t.parametersJson.length > 65_536)
      throw invalidArgument(`frame ${frameId}: client tool ${t.name}: parameters_json must be at most 64 KiB`);
    let schema: unknown;
    try {
      schema = JSON.parse(t.parametersJson);
    } catch {
      throw invalidArgument(`frame ${frameId}: client tool ${t.name}: parameters_json is not JSON`);
    }
    if (
      typeof schema !== "object" ||
      schema === null ||
      Array.isArray(schema) ||
      (schema as { type?: unknown }).type !== "object"
    )
      throw invalidArgument(
        `frame ${frameId}: client tool ${t.name}: parameters_json must be a JSON Schema of "type": "object"`,
      );
  }
}

/** A decision's own fields; whether its call waits is the session's to say. */
function validateDecision(frameId: string, d: ToolDecision, fromClient: boolean): void {
  if (!TOOL_CALL_ID.test(d.toolCallId))
    throw invalidArgument(`frame ${frameId}: tool_call_id must be 1-256 printable ASCII characters`);
  if (d.verdict === ToolVerdict.UNSPECIFIED || ToolVerdict[d.verdict] === undefined)
    throw invalidArgument(`frame ${frameId}: verdict must be APPROVE, REJECT or EDIT`);
  if (d.message.length > 8000) throw invalidArgument(`frame ${frameId}: message must be at most 8000 characters`);
  if (d.verdict === ToolVerdict.EDIT) {
    let args: unknown;
    try {
      args = JSON.parse(d.argumentsJson);
    } catch {
      throw invalidArgument(`frame ${frameId}: an edit's arguments_json must be a JSON object`);
    }
    if (typeof args !== "object" || args === null || Array.isArray(args))
      throw invalidArgument(`frame ${frameId}: an edit's arguments_json must be a JSON object`);
  } else if (d.argumentsJson !== "") throw invalidArgument(`frame ${frameId}: arguments_json is only for an edit`);
  if (fromClient && d.decidedBy !== "")
    throw invalidArgument(
      `frame ${frameId}: decided_by is set by the gateway from the caller's key, never by a client`,
    );
}

/** A model name as a client may choose one: empty (no choice), or provider/model of at most 200 characters. */
/** Reasoning efforts a session may choose; "default" goes back to its agent's. */
export const SESSION_EFFORTS = ["minimal", "low", "medium", "high", "default"] as const;

export function validateReasoningEffort(effort: string): void {
  if (effort !== "" && !(SESSION_EFFORTS as readonly string[]).includes(effort))
    throw invalidArgument(
      `reasoning_effort must be one of ${SESSION_EFFORTS.join(", ")}, not "${effort.slice(0, 40)}"`,
    );
}

export function validateModelName(model: string): void {
  if (model !== "" && !/^[A-Za-z0-9._:/@+-]{1,200}$/.test(model))
    throw invalidArgument(
      `model ${JSON.stringify(model.slice(0, 64))} is not valid: 1-200 of A-Z a-z 0-9 . _ : / @ + -`,
    );
}

export function validateSessionRef(sessionId: string, agentId: string, allowEmptySession: boolean): void {
  if (sessionId === "" ? !allowEmptySession : !isSessionId(sessionId)) {
    throw invalidArgument(
      `session_id ${JSON.stringify(sessionId.slice(0, 64))} is not valid: 1-128 of A-Z a-z 0-9 . _ : -`,
    );
  }
  if (agentId !== "" && !isAgentId(agentId))
    throw invalidArgument(`agent_id ${JSON.stringify(agentId.slice(0, 64))} is not valid: 1-64 of a-z 0-9 _ -`);
}

/**
 * The frame id of a channel message: the same (channel, account, idempotency key) always gives the
 * same id, so a message delivered twice is one frame, and an adapter knows which frame a run
 * answers (AgentStart.frame_id) before Deliver returns.
 */
export const inboundFrameId = (channel: string, accountId: string, idempotencyKey: string): string => {
  // The channel as the gateway names it (normaliseInbound), however the adapter spelled it.
  const named = channel.trim().toLowerCase();
  return `in:${createHash("sha256").update(`${named}\0${accountId}\0${idempotencyKey}`).digest("hex").slice(0, 40)}`;
};
