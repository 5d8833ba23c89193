// What an open run waits on: the tool calls its approval policy held (ToolApprovalRequested) and
// the decisions taken on them (ToolDecided), the calls of client tools (ClientToolCall) and the
// client's answers (ClientToolAnswered), and whether the run has stopped to wait (RunWaiting) or
// goes on (RunResumed). It is a fold over the run's events and nothing else: the actor applies
// each event as it publishes it, and a load applies the log's, so a wait survives a restart, a
// SIGKILL and a hand-over exactly as it was. agent_end ends it (the actor drops the object).
import { create } from "@bufbuild/protobuf";
import { timestampFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import {
  PendingToolCallSchema,
  type PendingToolCall,
  type AgentEvent,
  type ClientToolAnswered,
  type ToolDecided,
  ToolVerdict,
} from "../../shared/gen/troupe/v1/session_pb.js";

/** A held call, as its request announced it: a person's decision awaited, or a client's result. */
export interface HeldCall {
  kind: "approval" | "client";
  toolCallId: string;
  toolName: string;
  argumentsJson: string;
  /** The policy rule that asked ("" for a client tool). */
  rule: string;
  /** Who may decide or answer. */
  principal: string;
  onTimeout: string;
  sinceMs: number;
  deadlineMs: number;
}

/** A held call as SessionInfo lists it; `owner`: the session's principal, who may answer when no other is named. */
export const pendingCallOf = (h: HeldCall, owner: string): PendingToolCall =>
  create(PendingToolCallSchema, {
    toolCallId: h.toolCallId,
    toolName: h.toolName,
    argumentsJson: h.argumentsJson,
    rule: h.rule,
    since: timestampFromMs(h.sinceMs),
    ...(Number.isFinite(h.deadlineMs) ? { deadline: timestampFromMs(h.deadlineMs) } : {}),
    onTimeout: h.onTimeout,
    principal: h.principal || owner,
    kind: h.kind,
  });

/** The events that change a wait; the actor hands only these to `apply`. */
const WAIT_EVENTS = new Set([
  "toolApprovalRequested",
  "toolDecided",
  "clientToolCall",
  "clientToolAnswered",
  "runWaiting",
  "runResumed",
]);
/** The events that start a wait (the others only change one that exists). */
const WAIT_STARTS = new Set(["toolApprovalRequested", "clientToolCall"]);

/**
 * Applies `event` to the run's wait: to `waits`, or to a new one for `turnId` when the event
 * starts one. The wait it applied to; undefined when the event is not one of a wait's.
 */
export function foldWait(waits: ToolWaits | undefined, event: AgentEvent, turnId: string): ToolWaits | undefined {
  const kind = event.payload.case ?? "";
  if (!WAIT_EVENTS.has(kind) || !(waits || WAIT_STARTS.has(kind))) return undefined;
  const folded = waits ?? new ToolWaits(turnId);
  folded.apply(event);
  return folded;
}

export class ToolWaits {
  /** Approval calls and client calls, each by its id (a call may be both: approved, then sent to the client). */
  readonly held = new Map<string, HeldCall>();
  readonly clientCalls = new Map<string, HeldCall>();
  readonly decided = new Map<string, ToolDecided>();
  readonly answered = new Map<string, ClientToolAnswered>();
  /** The run stopped to wait (RunWaiting) and has not gone on yet. */
  suspended = false;
  /** Where the waiting run's messages begin in the whole history (the log's count), set when it stops. */
  from = 0;

  constructor(
    /** The run that waits. */
    readonly turnId: string,
  ) {}

  /** Applies one of WAIT_EVENTS of this run. */
  apply(ev: AgentEvent): void {
    const p = ev.payload;
    const atMs = ev.time ? timestampMs(ev.time) : Date.now();
    if (p.case === "toolApprovalRequested" || p.case === "clientToolCall") {
      const v = p.value;
      const client = p.case === "clientToolCall";
      const call: HeldCall = {
        kind: client ? "client" : "approval",
        toolCallId: v.toolCallId,
        toolName: v.toolName,
        argumentsJson: v.argumentsJson,
        rule: p.case === "toolApprovalRequested" ? p.value.rule : "",
        principal: p.case === "toolApprovalRequested" ? p.value.principal : "",
        onTimeout: p.case === "toolApprovalRequested" ? p.value.onTimeout : "deny",
        sinceMs: atMs,
        deadlineMs: v.deadline ? timestampMs(v.deadline) : Number.POSITIVE_INFINITY,
      };
      (client ? this.clientCalls : this.held).set(v.toolCallId, call);
    } else if (p.case === "toolDecided") {
      if (!this.decided.has(p.value.toolCallId)) this.decided.set(p.value.toolCallId, p.value);
    } else if (p.case === "clientToolAnswered") {
      if (!this.answered.has(p.value.toolCallId)) this.answered.set(p.value.toolCallId, p.value);
    } else if (p.case === "runWaiting") this.suspended = true;
    else if (p.case === "runResumed") this.suspended = false;
  }

  /** Held calls nobody has decided or answered yet, in the order they were held. */
  pending(): HeldCall[] {
    return [
      ...[...this.held.values()].filter((h) => !this.decided.has(h.toolCallId)),
      ...[...this.clientCalls.values()].filter((h) => !this.answered.has(h.toolCallId)),
    ];
  }

  /** The earliest deadline of a call still pending; undefined when none is. */
  nextDeadlineMs(): number | undefined {
    let next: number | undefined;
    for (const h of this.pending()) if (next === undefined || h.deadlineMs < next) next = h.deadlineMs;
    return next;
  }

  /** The run stopped to wait and every call it holds is decided: it may go on. */
  get due(): boolean {
    return this.suspended && this.pending().length === 0;
  }
}

/** Whether a client's answer repeats the one already taken (a resent result, acknowledged as a duplicate). */
export const sameAnswer = (taken: ClientToolAnswered, sent: { output: string; isError: boolean }): boolean =>
  taken.output === sent.output && taken.isError === sent.isError;

/** Whether `decision` says the same as the one already taken (a resent decision, acknowledged as a duplicate). */
export function sameDecision(
  taken: ToolDecided,
  sent: { verdict: ToolVerdict; message: string; argumentsJson: string },
): boolean {
  if (taken.verdict !== sent.verdict) return false;
  if (sent.verdict === ToolVerdict.EDIT) return sameJson(taken.argumentsJson, sent.argumentsJson);
  if (sent.verdict === ToolVerdict.REJECT) return taken.message === sent.message;
  return true;
}

function sameJson(a: string, b: string): boolean {
  try {
    return JSON.stringify(JSON.parse(a)) === JSON.stringify(JSON.parse(b));
  } catch {
    return a === b;
  }
}

export const VERDICT_NAME: Record<ToolVerdict, string> = {
  [ToolVerdict.UNSPECIFIED]: "unspecified",
  [ToolVerdict.APPROVE]: "approved",
  [ToolVerdict.REJECT]: "rejected",
  [ToolVerdict.EDIT]: "edited",
};
