// The session actor's side of each of its parts' host interfaces (session-actor.ts): the run slot,
// the journal, admission, supervision, the log writes and the mailbox. Each host is one object
// holding the actor, its methods on the prototype, so an idle actor holds six small objects here
// and no closures. They reach the actor's private state through `ActorInternals`.
import { toJson } from "@bufbuild/protobuf";
import type { RpcError } from "../../shared/errors.js";
import { type AgentEvent, type ClientFrame, ClientFrameSchema } from "../../shared/gen/troupe/v1/session_pb.js";
import type { SessionRef } from "../../shared/session-ref.js";
import type { Compaction, EventPayload } from "../loop/run.js";
import type { Admission, AdmissionHost } from "./admission.js";
import type { EventJournal, JournalHost } from "./event-journal.js";
import type { HeldHistory } from "./held-history.js";
import type { Mailbox, Queued } from "./mailbox.js";
import type { CutOff } from "./recovery.js";
import type { NextRun, RunSlot } from "./run-slot.js";
import type { Numbering } from "./session-rebuild.js";
import type { LogRecord, SessionLog, SessionOwner, SessionStore } from "./session-log.js";
import type { SessionWrites } from "./session-writes.js";
import type { RestartHost, Supervision } from "./supervision.js";
import type { TenantRuns } from "./tenant-runs.js";
import type { HeldCallsHost, HeldCalls } from "./held-calls.js";
import type { Resume } from "./session-rebuild.js";
import type { AuditRecord, AuditSink } from "../store/audit-log.js";
import type { Logger } from "../../shared/process/log.js";
import type { Tool } from "../tools/tools.js";
import type { ChatMessage } from "../../shared/gen/troupe/v1/session_pb.js";

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
  frozen: boolean;
  mailbox: Mailbox;
  slot: RunSlot;
  journal: EventJournal;
  admission: Admission;
  supervision: Supervision;
  history: HeldHistory;
  idle: boolean;
  idleWaiters: (() => void)[];
  updatedMs: number;
  activeMs: number;
  compaction?: Compaction;
  writes: SessionWrites;
  loseSession(err: RpcError, why: string): void;
  takeNext(): NextRun | undefined;
  execute(next: NextRun, signal: AbortSignal): Promise<void>;
  releaseUnseen(): void;
  abort(frameId: string, reason: string, clearQueue: boolean): void;
  emit(payload: EventPayload): AgentEvent;
  drop(queued: Queued[], message: string): void;
  replayLog(records: LogRecord[], numbering: Numbering, cutOff?: CutOff): void;
  held: HeldCalls;
  resuming?: Resume;
};

export class WritesHost {
  constructor(private readonly a: ActorInternals) {}
  lose(err: RpcError, why: string): void {
    this.a.loseSession(err, why);
  }
  lost(): RpcError | undefined {
    return this.a.lost;
  }
}

/** The mailbox's one callback: prompts gathered in collect mode are ready to run. */
export class CollectedHost {
  constructor(private readonly a: ActorInternals) {}
  readonly collected = (): void => this.a.slot.schedule();
}

export class SlotHost {
  constructor(private readonly a: ActorInternals) {}
  takeNext(): NextRun | undefined {
    return this.a.takeNext();
  }
  execute(next: NextRun, signal: AbortSignal): Promise<void> {
    return this.a.execute(next, signal);
  }
  started(): void {
    const a = this.a;
    a.deps.runs?.started(a.owner.tenant);
  }
  ended(): void {
    const a = this.a;
    a.deps.runs?.ended(a.owner.tenant);
    // Steering or follow-ups that came too late for the run are not lost: they run next. A run
    // that stopped to wait keeps them: steering ends its wait, follow-ups join it.
    if (!a.held.suspended) a.mailbox.requeueLate();
    a.releaseUnseen();
  }
  nothingOwed(): void {
    const a = this.a;
    a.journal.trimIdle();
    // A run that waits is owed its deadline, which a runner taking over must keep; a run handed
    // over (frozen) is owed its end: neither is settled.
    if (a.idle && a.held.waits === undefined && !a.frozen) a.writes.settle();
    // Prompts still gathering (collect mode) are work to come: not idle until they have run.
    if (a.idle) for (const wake of a.idleWaiters.splice(0)) wake();
  }
}

export class JournalHostOf implements JournalHost {
  constructor(private readonly a: ActorInternals) {}
  get sessionId(): string {
    return this.a.sessionId;
  }
  turnId(): string {
    return this.a.slot.turnId ?? "";
  }
  persist(record: LogRecord, sync: boolean): Promise<void> {
    return this.a.writes.append(record, sync);
  }
  readLog(): Promise<LogRecord[]> {
    const a = this.a;
    return a.deps.store.read(a.ref);
  }
  published(event: AgentEvent): void {
    const a = this.a;
    const now = Date.now();
    a.updatedMs = now;
    a.activeMs = now;
    a.held.published(event);
    if (event.payload.case === "compactionEnd") {
      a.compaction = {
        summary: event.payload.value.summary,
        firstKeptMessageId: event.payload.value.firstKeptMessageId,
      };
    }
  }
}

export class AdmissionHostOf implements AdmissionHost {
  constructor(private readonly a: ActorInternals) {}
  get sessionId(): string {
    return this.a.sessionId;
  }
  get mailbox(): Mailbox {
    return this.a.mailbox;
  }
  lost(): RpcError | undefined {
    return this.a.lost;
  }
  failed(): string | undefined {
    return this.a.supervision.failed;
  }
  restarting(): Promise<void> | undefined {
    return this.a.supervision.restarting;
  }
  /** A run that waits counts as going: messages are placed as its queue mode says for a running run. */
  running(): boolean {
    return this.a.slot.busy || this.a.held.suspended;
  }
  check(frame: ClientFrame): RpcError | "duplicate" | undefined {
    return this.a.held.check(frame);
  }
  takeRun(): void {
    const a = this.a;
    a.deps.runs?.admit(a.owner.tenant);
  }
  record(frame: ClientFrame): Promise<void> {
    return this.a.writes.appendOrRefuse({ t: "frame", frame: toJson(ClientFrameSchema, frame) }, true);
  }
  emit(payload: EventPayload): AgentEvent {
    return this.a.emit(payload);
  }
  placed(frame: ClientFrame, interrupt: boolean): void {
    const a = this.a;
    if (frame.kind.case === "abort") a.abort(frame.frameId, frame.kind.value.reason, frame.kind.value.clearQueue);
    if (frame.kind.case === "toolDecision" || frame.kind.case === "clientToolResult") a.held.take(frame);
    if (interrupt && (a.slot.busy || a.held.suspended))
      a.abort(frame.frameId, "interrupted by a prompt in interrupt mode", false);
    a.held.goOnIfDue();
    a.slot.schedule();
  }
}

export class RestartHostOf implements RestartHost {
  constructor(private readonly a: ActorInternals) {}
  get sessionId(): string {
    return this.a.sessionId;
  }
  admitting(): number {
    return this.a.admission.admitting;
  }
  async readLog(): Promise<LogRecord[]> {
    const a = this.a;
    await a.log.flush().catch(() => undefined);
    return a.deps.store.read(a.ref);
  }
  rebuild(records: LogRecord[], cutOff: CutOff): void {
    const a = this.a;
    const live = a.journal.lastSeq;
    a.history.clear();
    a.admission.clear();
    a.mailbox.clear();
    a.compaction = undefined;
    a.replayLog(records, { live }, cutOff);
  }
  emit(payload: EventPayload): void {
    this.a.emit(payload);
  }
  dropQueued(message: string): void {
    const a = this.a;
    a.drop(a.mailbox.queue.splice(0).flat(), message);
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
  running(): boolean {
    return this.a.slot.busy;
  }
  blocked(): boolean {
    return this.a.resuming !== undefined || this.a.lost !== undefined;
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
    this.a.resuming = resume;
    this.a.slot.schedule();
  }
  messages(): ChatMessage[] {
    return this.a.history.messages;
  }
  closed(): void {
    this.a.releaseUnseen();
    this.a.slot.schedule();
  }
  abortRun(why: string): void {
    this.a.slot.abort(new Error(why));
  }
  agentTools(): readonly Tool[] {
    const a = this.a;
    return a.deps.runDeps(a as never, []).tools;
  }
  audit(record: AuditRecord): void {
    const a = this.a;
    a.deps.audit
      .record(record)
      .catch((err: unknown) => a.deps.logger.error("audit log write failed", { error: String(err) }));
  }
}
