// What an open run waits on: the tool calls its approval policy held (ToolApprovalRequested), the
// decisions taken on them (ToolDecided), and whether the run has stopped to wait (RunWaiting) or
// goes on (RunResumed). It is a fold over the run's events and nothing else: the actor applies
// each event as it publishes it, and a load applies the log's, so a wait survives a restart, a
// SIGKILL and a hand-over exactly as it was. agent_end ends it (the actor drops the object).
import { timestampMs } from "@bufbuild/protobuf/wkt";
import {
  type AgentEvent,
  type ToolApprovalRequested,
  type ToolDecided,
  ToolVerdict,
} from "../../shared/gen/troupe/v1/session_pb.js";

/** A held call, as its request announced it. */
export interface HeldCall {
  request: ToolApprovalRequested;
  sinceMs: number;
  deadlineMs: number;
}

/** The events that change a wait (the first request makes one); the actor hands only these to `apply`. */
export const WAIT_EVENTS = new Set(["toolApprovalRequested", "toolDecided", "runWaiting", "runResumed"]);

export class ToolWaits {
  readonly held = new Map<string, HeldCall>();
  readonly decided = new Map<string, ToolDecided>();
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
    if (p.case === "toolApprovalRequested") {
      const deadlineMs = p.value.deadline ? timestampMs(p.value.deadline) : Number.POSITIVE_INFINITY;
      this.held.set(p.value.toolCallId, { request: p.value, sinceMs: atMs, deadlineMs });
    } else if (p.case === "toolDecided") {
      if (!this.decided.has(p.value.toolCallId)) this.decided.set(p.value.toolCallId, p.value);
    } else if (p.case === "runWaiting") this.suspended = true;
    else if (p.case === "runResumed") this.suspended = false;
  }

  /** Held calls nobody has decided yet, in the order they were held. */
  pending(): HeldCall[] {
    return [...this.held.values()].filter((h) => !this.decided.has(h.request.toolCallId));
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
