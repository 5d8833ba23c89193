// Recovery: what a session's log says its state is. The actor calls `replayRecords` when it loads
// (after a clean close or a crash) and when supervision restarts it in place, then
// `closeCutOffRun` for a run the log shows as started and never ended. Both are pure over the
// records and the `emit` they are given, so they are tested without an actor.
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import {
  AgentEventSchema,
  ClientFrameSchema,
  Role,
  StopReason,
  type AgentEvent,
  type ChatMessage,
  type ClientFrame,
  type QueueMode,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { injectUserMessages } from "../loop/loop.js";
import { answerUnanswered, type Compaction, type EventPayload, type QueuedMessage } from "../loop/run.js";
import type { ClientToolRecord, LogRecord } from "./session-log.js";
import { foldWait, type ToolWaits } from "./tool-waits.js";

/** Why a run the log shows as unfinished ended, and (when this process saw it fail) what started it. */
export interface CutOff {
  reason: StopReason;
  message: string;
  /** The messages that started the cut-off run (known when this process saw it fail). */
  startedBy?: QueuedMessage[];
}

/** The cut-off of a run the runner died in. */
export const INTERRUPTED: CutOff = {
  reason: StopReason.INTERRUPTED,
  message: "the runner stopped while this run was going",
};

/**
 * The seq a reloaded session numbers on from. After a clean close the log knows the last seq; after
 * a crash, seqs up to the reservation may have reached clients, so numbering continues past it (a
 * replay reports the jump as a gap). A clean close counts if nothing but the next activations'
 * epoch records followed it.
 */
export function resumeSeq(records: readonly LogRecord[]): number {
  let last = 0;
  let reserved = 0;
  let closedAt: number | undefined;
  for (const rec of records) {
    if (rec.t !== "epoch" && rec.t !== "settled") closedAt = rec.t === "closed" ? rec.seq : undefined;
    if (rec.t === "seq") reserved = Math.max(reserved, rec.upTo);
    else if (rec.t === "event") last = Math.max(last, Number((rec.event as { seq?: string }).seq ?? 0));
  }
  return Math.max(last, closedAt ?? reserved);
}

/** A session's state as its log records it. */
export interface ReplayedLog {
  /** The last queue mode set, if any was. */
  queueMode?: QueueMode;
  /** The last model chosen for the session, if any was. */
  model?: string;
  /** The session's client tools, as last set. */
  clientTools?: ClientToolRecord[];
  /** The frame whose message started the open turn. */
  openTurnFrame?: string;
  /** The last reasoning effort chosen ("" once set back to the agent's). */
  reasoningEffort?: string;
  /** The first message the model sees after the latest reset. */
  contextFrom?: number;
  /** The conversation: every message_end, in order. */
  messages: ChatMessage[];
  /** frame_id -> its first frame_accepted event (a resent frame is acknowledged with it). */
  acks: Map<string, AgentEvent>;
  /** The latest compaction. */
  compaction?: Compaction;
  /** The highest seq of an event in the log. */
  lastSeq: number;
  /** When the last event happened, if there was one. */
  updatedMs?: number;
  /** The turn of a run that started and never ended. */
  openTurn?: string;
  /** Where in `messages` the open turn's messages begin. */
  openTurnFrom: number;
  /** Every accepted frame, in acceptance order. */
  accepted: ClientFrame[];
  /** Frames dropped on request (an abort that cleared the queue, a failed session, a hook's block). */
  dropped: Set<string>;
  /** The open turn's tool calls that started and never ended (running when the runner stopped). */
  running: Set<string>;
  /** What the open turn waits on, if it held calls for a decision (tool-waits.ts). */
  waits?: ToolWaits;
}

/** Reads a session's state out of its records; records it does not know are skipped. */
export function replayRecords(records: readonly LogRecord[]): ReplayedLog {
  const out: ReplayedLog = {
    messages: [],
    acks: new Map(),
    lastSeq: 0,
    accepted: [],
    dropped: new Set(),
    openTurnFrom: 0,
    running: new Set(),
  };
  const accepted = new Map<string, ClientFrame>();
  for (const rec of records) {
    if (rec.t === "settings") {
      if (rec.queueMode !== undefined) out.queueMode = rec.queueMode;
      if (rec.model !== undefined) out.model = rec.model;
      if (rec.reasoningEffort !== undefined) out.reasoningEffort = rec.reasoningEffort;
      if (rec.contextFrom !== undefined) out.contextFrom = rec.contextFrom;
      if (rec.clientTools !== undefined) out.clientTools = rec.clientTools;
    } else if (rec.t === "elided") {
      const gone = new Set(rec.messageIds);
      out.messages = out.messages.filter((m) => !gone.has(m.id));
    } else if (rec.t === "frame") {
      const frame = fromJson(ClientFrameSchema, rec.frame as JsonValue);
      accepted.set(frame.frameId, frame);
    } else if (rec.t === "event") {
      const ev = fromJson(AgentEventSchema, rec.event as JsonValue);
      out.lastSeq = Math.max(out.lastSeq, Number(ev.seq));
      if (ev.time) out.updatedMs = Number(ev.time.seconds) * 1000 + Math.floor(ev.time.nanos / 1e6);
      const p = ev.payload;
      if (p.case === "messageEnd" && p.value.message) out.messages.push(p.value.message);
      else if (p.case === "frameAccepted" && !p.value.duplicate) out.acks.set(p.value.frameId, ev);
      else if (p.case === "error" && p.value.code === "CANCELLED" && p.value.frameId) out.dropped.add(p.value.frameId);
      else if (p.case === "messageBlocked") out.dropped.add(p.value.frameId);
      else if (p.case === "compactionEnd")
        out.compaction = { summary: p.value.summary, firstKeptMessageId: p.value.firstKeptMessageId };
      else if (p.case === "agentStart") {
        out.openTurn = ev.turnId;
        out.openTurnFrom = out.messages.length;
        out.openTurnFrame = p.value.frameId;
        out.running.clear();
        out.waits = undefined;
      } else if (p.case === "agentEnd") {
        out.openTurn = undefined;
        out.running.clear();
        out.waits = undefined;
      } else if (p.case === "toolExecutionStart") out.running.add(p.value.toolCallId);
      else if (p.case === "toolExecutionEnd") out.running.delete(p.value.toolCallId);
      const folded = out.openTurn === undefined ? undefined : foldWait(out.waits, ev, out.openTurn);
      if (folded) {
        out.waits = folded;
        folded.from = out.openTurnFrom;
      }
    }
  }
  out.accepted = [...accepted.values()];
  return out;
}

/**
 * Closes a run that was cut off (a crash, or a failure): the messages that started it join the
 * history, every tool call still unanswered gets an error result, then agent_end. Events go out
 * through `emit` (numbered under turn `turnId` by the caller); `messages` is updated in place.
 */
export function closeCutOffRun(
  emit: (payload: EventPayload) => void,
  messages: ChatMessage[],
  cutOff: CutOff,
  unappliedStarters: QueuedMessage[],
): void {
  injectUserMessages({ emit, messages }, unappliedStarters);
  answerUnanswered(emit, messages, `Interrupted: ${cutOff.message}.`);
  emit({ case: "agentEnd", value: { stopReason: cutOff.reason, errorMessage: cutOff.message } });
}

/** What the actor does with a run its runner died in (see RunResumed in session.proto). */
export type CutRun =
  /** Its messages are in the history: it goes on from its last complete step. */
  | { resume: true; from: number; interrupted: string[] }
  /** It had answered (the runner died before agent_end): it is closed as it ended. */
  | { resume: false; ended: StopReason };

/**
 * Decides about an open turn found when a session loads after its runner died. A turn whose final
 * answer is in the log is closed with that answer's stop reason (asking again would answer twice);
 * one with none of its messages in the log is cut (its messages run again from the queue).
 */
export function cutRunOf(log: ReplayedLog): CutRun | undefined {
  if (log.openTurn === undefined || log.messages.length <= log.openTurnFrom) return undefined;
  const last = log.messages[log.messages.length - 1];
  if (last.role === Role.ASSISTANT && last.toolCalls.length === 0) {
    const ended = last.stopReason === StopReason.UNSPECIFIED ? StopReason.COMPLETED : last.stopReason;
    return { resume: false, ended };
  }
  return { resume: true, from: log.openTurnFrom, interrupted: [...log.running] };
}

/** Supervision: this many unexpected run failures within RESTART_WINDOW_MS mark the session failed. */
export const RESTART_LIMIT = 5;
export const RESTART_WINDOW_MS = 60_000;

/** Counts a session's unexpected run failures over a sliding window (supervision's budget). */
export class RestartBudget {
  private times: number[] = [];

  /**
   * Records a failure at `now`. Returns the backoff before the restart (doubling per recent
   * failure from 100 ms) and, when this failure spent the budget, why the session fails.
   */
  spend(now: number): { backoffMs: number; failed?: string } {
    this.times = [...this.times.filter((t) => now - t < RESTART_WINDOW_MS), now];
    const n = this.times.length;
    const failed =
      n >= RESTART_LIMIT
        ? `${n} unexpected failures within ${RESTART_WINDOW_MS / 1000} s; see the runner's log`
        : undefined;
    return { backoffMs: 100 * 2 ** (n - 1), failed };
  }
}
