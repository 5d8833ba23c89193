// What the session actor (session-actor.ts) carries out for the parts that decide: a frame's way
// in (admitFrame, as admission.ts decides), a restart (restartFromLog, as supervision.ts decides),
// and the loop's callbacks for a run (runHostOf). And the actor's side of the host interfaces of
// the two parts that still call out (the log writes, the held calls): each one object holding the
// actor, its methods on the prototype, so an idle actor holds two small objects here and no
// closures. All of it reaches the actor's private state through `ActorInternals`.
import { toJson } from "@bufbuild/protobuf";
import type { Context } from "@opentelemetry/api";
import { FRAME_KIND } from "../../shared/frames.js";
import type { RpcError } from "../../shared/errors.js";
import {
  type AgentEvent,
  type ClientFrame,
  ClientFrameSchema,
  StopReason,
} from "../../shared/gen/troupe/v1/session_pb.js";
import type { SessionRef } from "../../shared/session-ref.js";
import type { Compaction, EventPayload, QueuedMessage, RunHost } from "../loop/run.js";
import { type Admission, duplicateAck, refusalEvent } from "./admission.js";
import type { EventJournal } from "./event-journal.js";
import type { HeldHistory } from "./held-history.js";
import { COLLECT_WINDOW_MS, FrameRefused, type Mailbox, type Placed, type Queued } from "./mailbox.js";
import type { CutOff } from "./recovery.js";
import type { RunSlot } from "./run-slot.js";
import type { SessionChoices } from "./session-choices.js";
import type { Numbering } from "./session-rebuild.js";
import type { LogRecord, SessionLog, SessionOwner, SessionStore } from "./session-log.js";
import type { SessionWrites } from "./session-writes.js";
import type { Supervision } from "./supervision.js";
import type { TenantRuns } from "./tenant-runs.js";
import type { HeldCallsHost, HeldCalls } from "./held-calls.js";
import type { Resume } from "./session-rebuild.js";
import type { AuditRecord, AuditSink } from "../store/audit-log.js";
import type { Logger } from "../../shared/process/log.js";
import type { Tool } from "../tools/tools.js";
import type { ChatMessage } from "../../shared/gen/troupe/v1/session_pb.js";
import { type Happening, type Phase, runOn } from "./lifecycle.js";

/** What the hosts below use of an actor (its members, private ones among them, by name). */
export type ActorInternals = {
  sessionId: string;
  owner: SessionOwner;
  ref: SessionRef;
  deps: {
    store: SessionStore;
    runs?: TenantRuns;
    audit: AuditSink;
    logger: Logger;
    runDeps(actor: never, first: readonly never[]): { tools: readonly Tool[] };
  };
  log: SessionLog;
  lost?: RpcError;
  phase: Phase;
  happen(happening: Happening): void;
  mailbox: Mailbox;
  slot: RunSlot;
  journal: EventJournal;
  admission: Admission;
  supervision: Supervision;
  history: HeldHistory;
  idle: boolean;
  idleWaiters: (() => void)[];
  compaction?: Compaction;
  writes: SessionWrites;
  loseSession(err: RpcError, why: string): void;
  schedule(): void;
  collectTimer?: NodeJS.Timeout;
  choices: SessionChoices;
  releaseUnseen(): void;
  emit(payload: EventPayload): AgentEvent;
  drop(queued: Queued[], message: string): void;
  replayLog(records: LogRecord[], numbering: Numbering, cutOff?: CutOff): void;
  held: HeldCalls;
  owedResume?: Resume;
};

/** Writes an audit record; a failed write is logged, never thrown. */
function auditQuietly(a: ActorInternals, record: AuditRecord): void {
  a.deps.audit
    .record(record)
    .catch((err: unknown) => a.deps.logger.error("audit log write failed", { error: String(err) }));
}

export class WritesHost {
  constructor(private readonly a: ActorInternals) {}
  lose(err: RpcError, why: string): void {
    this.a.loseSession(err, why);
  }
  lost(): RpcError | undefined {
    return this.a.lost;
  }
}

/**
 * The loop's one object of callbacks for a run (loop/run.ts RunHost holds each one's contract),
 * bound here and nowhere else.
 */
export function runHostOf(a: ActorInternals, signal: AbortSignal): RunHost {
  const { history, held, journal, mailbox } = a;
  return {
    sessionId: a.sessionId,
    model: a.choices.model,
    reasoningEffort: a.choices.reasoningEffort,
    contextFrom: Math.max(0, a.choices.contextFrom - history.released),
    conversationBefore: history.releasedConversation,
    signal,
    messages: history.messages,
    emit: (payload) => void a.emit(payload),
    delta: (messageId, kind, text) => journal.delta(messageId, kind, text, a.slot.turnId ?? ""),
    pressure: () => journal.pressure(),
    takeSteering: () => mailbox.steering.splice(0),
    takeFollowUps: () => mailbox.followUps.splice(0),
    compaction: () => a.compaction,
    elide: (ids) => {
      const gone = new Set(ids);
      history.messages.splice(0, history.messages.length, ...history.messages.filter((m) => !gone.has(m.id)));
      void a.writes.append({ t: "elided", messageIds: ids }, false);
    },
    clientTools: held.runTools(),
    isHeld: (id, kind) => held.isHeld(id, kind),
    decisionOf: (id) => held.decisionOf(id),
    clientResultOf: (id) => held.clientResultOf(id),
  };
}

/**
 * Admits one frame (not `open`) as admission.ts decides, and resolves to its frame_accepted event
 * once the frame is durable in the log. A refused frame rejects with FrameRefused, announced to
 * every subscriber; nothing of it is recorded.
 */
export function admitFrame(a: ActorInternals, frame: ClientFrame, traceContext: Context): Promise<AgentEvent> {
  if (a.lost) return Promise.reject(a.lost);
  const failed = a.admission.failedRefusal(frame, a.sessionId, failedWhy(a));
  if (failed) return Promise.reject(refused(a, frame, failed));
  const earlier = a.admission.earlier(frame.frameId);
  if (earlier) return earlier.then(() => a.emit(duplicateAck(frame)));
  const ack = carryIn(a, frame, traceContext);
  a.admission.track(frame.frameId, ack);
  return ack;
}

async function carryIn(a: ActorInternals, frame: ClientFrame, traceContext: Context): Promise<AgentEvent> {
  while (a.supervision.restarting) await a.supervision.restarting;
  const failed = a.admission.failedRefusal(frame, a.sessionId, failedWhy(a));
  if (failed) throw refused(a, frame, failed);
  const standing = { sessionId: a.sessionId, mailbox: a.mailbox, running: runOn(a.phase), check: a.held.check(frame) };
  const screening = a.admission.screen(frame, standing);
  if (screening === "duplicate") return a.emit(duplicateAck(frame));
  if ("refuse" in screening) throw refused(a, frame, screening.refuse);
  if (screening.admit.startsRun) {
    try {
      a.deps.runs?.admit(a.owner.tenant);
    } catch (err) {
      throw refused(a, frame, err as RpcError);
    }
  }
  const written = a.admission.writing(frame);
  try {
    // Not acknowledged when this fails, so the client resends; the session reloads from its log.
    await a.writes.appendOrRefuse({ t: "frame", frame: toJson(ClientFrameSchema, frame) }, true);
  } finally {
    written();
  }
  const q = a.mailbox.toQueued(frame, traceContext);
  const placed: Placed = q ? a.mailbox.place(q, frame, runOn(a.phase)) : { position: 0, interrupt: false };
  const ack = a.emit({
    case: "frameAccepted",
    value: { frameId: frame.frameId, kind: FRAME_KIND[frame.kind.case!], queuePosition: placed.position },
  });
  actOnPlaced(a, frame, placed);
  return ack;
}

/** Why the session failed, once it has (it then takes nothing but aborts). */
function failedWhy(a: ActorInternals): string | undefined {
  return a.phase === "failed" ? a.supervision.failed : undefined;
}

/** Tells every subscriber why `frame` was refused; the error the caller gets, with its trailers (a retry hint). */
function refused(a: ActorInternals, frame: ClientFrame, err: RpcError): FrameRefused {
  a.emit(refusalEvent(frame, err));
  return new FrameRefused(err.code, err.message, err.trailers);
}

/** Acts on a frame now in the mailbox: an abort, a decision, an interrupt, a collection, a run to start. */
function actOnPlaced(a: ActorInternals, frame: ClientFrame, { interrupt, collecting }: Placed): void {
  if (frame.kind.case === "abort") abortRun(a, frame.frameId, frame.kind.value.reason, frame.kind.value.clearQueue);
  if (frame.kind.case === "toolDecision" || frame.kind.case === "clientToolResult") a.held.take(frame);
  if (interrupt && runOn(a.phase)) abortRun(a, frame.frameId, "interrupted by a prompt in interrupt mode", false);
  if (collecting) {
    // Each prompt that joins a collection starts its quiet window again; when it passes, the
    // gathered prompts are one run.
    clearTimeout(a.collectTimer);
    a.collectTimer = setTimeout(() => {
      a.collectTimer = undefined;
      if (a.mailbox.closeCollection()) a.schedule();
    }, COLLECT_WINDOW_MS);
  }
  a.held.goOnIfDue();
  a.schedule();
}

/** An abort (or an interrupting prompt): audited; the run going, or the one waiting, ends. */
function abortRun(a: ActorInternals, frameId: string, reason: string, clearQueue: boolean): void {
  const { tenant } = a.owner;
  auditQuietly(a, {
    action: "abort",
    sessionId: a.sessionId,
    tenant,
    frameId,
    reason,
    turnId: a.slot.turnId ?? "",
    clearQueue,
  });
  if (clearQueue) a.drop(a.mailbox.clear(), `dropped by an abort that cleared the queue${reason ? `: ${reason}` : ""}`);
  a.slot.abort(new Error(reason || "aborted"));
  a.held.endWait(
    StopReason.ABORTED,
    `the run was aborted while this call waited for a decision${reason ? ` (${reason})` : ""}`,
  );
}

/**
 * Restarts an actor whose run (started by `startedBy`) threw, as supervision decided: frames past
 * admission land in the log first, then after the backoff the actor forgets what it holds and
 * rebuilds from its log, the failed run closed as an error (its starting messages kept in the
 * history, not run again); what was queued comes back from the log and runs after.
 */
export async function restartFromLog(a: ActorInternals, startedBy: QueuedMessage[]): Promise<void> {
  const restart = a.supervision.begin(Date.now());
  const message = "the run failed unexpectedly";
  a.emit({
    case: "error",
    value: { code: "INTERNAL", message: `${message}; the session restarts from its log`, retryable: true },
  });
  try {
    while (a.admission.admitting > 0) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => setTimeout(r, restart.backoffMs));
    await a.log.flush().catch(() => undefined);
    const records = await a.writes.read();
    const live = a.journal.lastSeq;
    a.history.clear();
    a.admission.clear();
    a.mailbox.clear();
    a.compaction = undefined;
    a.replayLog(records, { live }, { reason: StopReason.ERROR, message, startedBy });
    if (restart.failed) {
      a.supervision.failed = restart.failed;
      a.happen("gaveUp");
      a.drop(a.mailbox.queue.splice(0).flat(), "dropped: the session failed");
      const failed = `session ${a.sessionId} has failed: ${restart.failed}`;
      a.emit({ case: "error", value: { code: "SESSION_FAILED", message: failed, retryable: false } });
    }
  } finally {
    restart.done();
  }
}

export class HeldCallsHostOf implements HeldCallsHost {
  constructor(private readonly a: ActorInternals) {}
  get sessionId(): string {
    return this.a.sessionId;
  }
  get tenant(): string {
    return this.a.owner.tenant;
  }
  get principal(): string {
    return this.a.owner.principal;
  }
  phase(): Phase {
    return this.a.phase;
  }
  steering(): boolean {
    return this.a.mailbox.steering.length > 0;
  }
  asRun(turnId: string, fn: () => void): void {
    this.a.slot.asRun(turnId, fn);
  }
  emit(payload: EventPayload): void {
    this.a.emit(payload);
  }
  resume(resume: Resume): void {
    const a = this.a;
    a.owedResume = resume;
    a.happen("waitAnswered");
    a.schedule();
  }
  messages(): ChatMessage[] {
    return this.a.history.messages;
  }
  closed(): void {
    const a = this.a;
    a.happen("waitClosed");
    a.releaseUnseen();
    a.schedule();
  }
  abortRun(why: string): void {
    this.a.slot.abort(new Error(why));
  }
  agentTools(): readonly Tool[] {
    const a = this.a;
    return a.deps.runDeps(a as never, []).tools;
  }
  audit(record: AuditRecord): void {
    auditQuietly(this.a, record);
  }
}
