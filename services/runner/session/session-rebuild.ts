// A session actor rebuilt from its log: on a load (after a restart of the runner, a hand-over, a
// passivation) and in place after a run failed unexpectedly (supervision). The log is read by
// recovery.ts; this file puts what it shows back into the actor's parts and decides what is owed:
// acknowledgements, the end of a run that was cut off, or the run to resume, and the messages
// accepted but never run.
import { ROOT_CONTEXT } from "@opentelemetry/api";
import { Role, type AgentEvent, type ClientFrame } from "../../shared/gen/troupe/v1/session_pb.js";
import { FRAME_KIND } from "../../shared/frames.js";
import * as recovery from "./recovery.js";
import type { CutOff } from "./recovery.js";
import { INTERRUPTED } from "./recovery.js";
import type { Compaction, EventPayload } from "../loop/run.js";
import type { Admission } from "./admission.js";
import type { EventJournal } from "./event-journal.js";
import type { HeldHistory } from "./held-history.js";
import type { Mailbox } from "./mailbox.js";
import type { SessionChoices } from "./session-choices.js";
import type { ClientToolRecord, LogRecord } from "./session-log.js";
import type { ToolWaits } from "./tool-waits.js";

/** The parts of an actor a rebuild writes into, bound in one place (SessionActor.rebuildParts). */
export interface RebuiltParts {
  readonly mailbox: Mailbox;
  readonly choices: SessionChoices;
  /** Empty when the rebuild starts. */
  readonly history: HeldHistory;
  readonly admission: Admission;
  readonly journal: EventJournal;
  /** Sets the latest compaction and the time of the last event the log shows (undefined: none). */
  restored(compaction: Compaction | undefined, updatedMs: number | undefined): void;
  /** Publishes an event: numbered, recorded and sent. */
  emit(payload: EventPayload): AgentEvent;
  /** Runs `close` with turn `turnId` as the actor's run, so what it emits belongs to that turn. */
  asRun(turnId: string, close: () => void): void;
  /** The open run holds calls for decisions: the actor keeps `waits` (and arms its deadline). */
  waiting(waits: ToolWaits): void;
  /** Takes a decision (or a client's result) whose frame the log has and whose event it has not (the runner died between). */
  decide(frame: ClientFrame): void;
  /** The session's client tools, and those of the prompt that started the open run. */
  clientTools(session: ClientToolRecord[], run: ClientToolRecord[]): void;
}

/**
 * How events are numbered from now on: after `live` (a restart in place, whose journal goes on),
 * or from `resumeAt` with seqs up to `reservedUpTo` reserved (a load).
 */
export type Numbering = { live: number } | { resumeAt: number; reservedUpTo: number };

/** A run to go on with before anything queued: one its runner died in (recovery.ts cutRunOf), or one whose wait ended. */
export interface Resume {
  turnId: string;
  from: number;
  /** Calls running when the runner died: answered as interrupted. */
  interrupted: string[];
  afterWait?: boolean;
}

/**
 * Rebuilds `parts` from `records`. A run the log shows open is resumed (returned) when it was
 * cut off by a crash mid-turn, closed as it had ended, or closed as `cutOff` says (a restart in
 * place: the failed run's starting messages join the history, not run again).
 */
export function rebuildFromLog(
  parts: RebuiltParts,
  records: LogRecord[],
  numbering: Numbering,
  cutOff: CutOff = INTERRUPTED,
): Resume | undefined {
  const { mailbox, history, admission, journal } = parts;
  const log = recovery.replayRecords(records);
  if (log.queueMode !== undefined) mailbox.mode = log.queueMode;
  parts.choices.restore(log);
  history.messages.push(...log.messages);
  for (const [frameId, ev] of log.acks) admission.restore(frameId, () => ev);
  const starter = log.accepted.find((f) => f.frameId === log.openTurnFrame)?.kind;
  parts.clientTools(
    log.clientTools ?? [],
    log.openTurn !== undefined && starter?.case === "prompt" ? starter.value.clientTools : [],
  );
  parts.restored(log.compaction, log.updatedMs);
  journal.saw(log.lastSeq);
  if ("live" in numbering) journal.saw(numbering.live);
  else journal.resumeAt(numbering.resumeAt, numbering.reservedUpTo);
  // Every accepted message is in the history, or was dropped on request, or is owed a run.
  const inHistory = new Set(history.messages.filter((m) => m.role === Role.USER).map((m) => m.frameId));
  const cut = "live" in numbering || cutOff !== INTERRUPTED ? undefined : recovery.cutRunOf(log);
  let resume: Resume | undefined;
  const waits = "live" in numbering ? undefined : log.waits;
  if (log.openTurn !== undefined && waits) {
    parts.waiting(waits);
    for (const frame of log.accepted) {
      const k = frame.kind;
      const owed =
        (k.case === "toolDecision" && waits.held.has(k.value.toolCallId) && !waits.decided.has(k.value.toolCallId)) ||
        (k.case === "clientToolResult" &&
          waits.clientCalls.has(k.value.toolCallId) &&
          !waits.answered.has(k.value.toolCallId));
      if (owed) parts.decide(frame);
    }
  }
  if (log.openTurn !== undefined && waits?.suspended) {
    // A run stopped to wait stays waiting; it goes on once every call it holds is decided.
    if (waits.due) resume = { turnId: log.openTurn, from: waits.from, interrupted: [], afterWait: true };
  } else if (log.openTurn !== undefined && cut?.resume)
    resume = { turnId: log.openTurn, from: cut.from, interrupted: cut.interrupted };
  else if (log.openTurn !== undefined && cut && !cut.resume) {
    const ended = cut.ended;
    parts.asRun(log.openTurn, () => parts.emit({ case: "agentEnd", value: { stopReason: ended, errorMessage: "" } }));
  } else if (log.openTurn !== undefined) {
    // A failed run's starting messages are kept in the history, not run again: they may be the trigger.
    const starters = (cutOff.startedBy ?? []).filter((q) => !inHistory.has(q.frameId) && !log.dropped.has(q.frameId));
    for (const q of starters) inHistory.add(q.frameId);
    parts.asRun(log.openTurn, () =>
      recovery.closeCutOffRun((payload) => void parts.emit(payload), history.messages, cutOff, starters),
    );
  }
  for (const frame of log.accepted) {
    if (inHistory.has(frame.frameId) || log.dropped.has(frame.frameId)) continue;
    const q = mailbox.toQueued(frame, ROOT_CONTEXT);
    if (q) mailbox.queue.push([q]);
    const kind = FRAME_KIND[frame.kind.case!];
    admission.restore(frame.frameId, () =>
      parts.emit({ case: "frameAccepted", value: { frameId: frame.frameId, kind } }),
    );
  }
  return resume;
}
