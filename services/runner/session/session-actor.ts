// One actor per session. It owns the session's state (conversation, seq, queues), admits client
// frames in arrival order, runs one agent run at a time (the turn lock), and publishes every event
// to the streams attached to it. A frame is acknowledged only after it is durably in the log.
// Where the session stands is one phase, moved only by `happen` through lifecycle.ts's table.
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { ROOT_CONTEXT, type Context } from "@opentelemetry/api";
import {
  AgentEventSchema,
  ChatMessageSchema,
  type QueueMode,
  SessionInfoSchema,
  type SessionState,
  type AgentEvent,
  type ChatMessage,
  type ClientFrame,
  type ClientTool,
  type SessionInfo,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { validateFrame } from "../../shared/frames.js";
import { invalidArgument, type RpcError } from "../../shared/errors.js";
import { newId } from "../../shared/ids.js";
import { clientToolSpecs } from "../tools/client-tools.js";
import { HeldCalls } from "./held-calls.js";
import { pendingCallOf } from "./tool-waits.js";
import { failure, type Logger } from "../../shared/process/log.js";
import { runAgent } from "../loop/loop.js";
import { resumedMessages } from "../loop/turn-start.js";
import { type CutOff, INTERRUPTED, replayRecords, resumeSeq } from "./recovery.js";
import { pushMessage } from "../loop/run.js";
import type { Compaction, EventPayload, QueuedMessage, RunDeps } from "../loop/run.js";
import type { AuditSink } from "../store/audit-log.js";
import { refOf, type SessionRef } from "../../shared/session-ref.js";
import type { TenantRuns } from "./tenant-runs.js";
import { EventJournal, type EventSubscriber, SEQ_BLOCK } from "./event-journal.js";
import { Mailbox, type Queued } from "./mailbox.js";
import { Admission } from "./admission.js";
import {
  ownerOf,
  settledLog,
  type ClientToolRecord,
  type LogRecord,
  type SessionLog,
  type SessionOwner,
  type SessionStore,
  type Subagent,
} from "./session-log.js";
import { SessionWrites } from "./session-writes.js";
import { SessionChoices, type Choice, type ChoiceRecord } from "./session-choices.js";
import { HeldHistory } from "./held-history.js";
import { type Numbering, type RebuiltParts, type Resume, rebuildFromLog } from "./session-rebuild.js";
import { Supervision } from "./supervision.js";
import type { Happening, Phase } from "./lifecycle.js";
import { UNEXPECTED, atRest, idleIn, nextPhase, runGoing, sessionStateOf } from "./lifecycle.js";
import { type NextRun, RunSlot } from "./run-slot.js";
import {
  type ActorInternals,
  admitFrame,
  HeldCallsHostOf,
  restartFromLog,
  runHostOf,
  WritesHost,
} from "./actor-hosts.js";

/** What an actor is given: its store, the audit log, the logger, and what its runs use. */
export interface ActorDeps {
  store: SessionStore;
  audit: AuditSink;
  logger: Logger;
  /** A run's dependencies, for the messages that start it (their speaker decides whose memories). Contract: never throws. */
  runDeps(actor: SessionActor, first: readonly QueuedMessage[]): RunDeps;
  /** Runs going per tenant (the concurrentRuns quota); none: no quota. */
  runs?: TenantRuns;
}

export class SessionActor {
  /** The messages the model can still see, and a tally of the rest (held-history.ts). */
  readonly history = new HeldHistory();
  /** Numbering, recording and fan-out of this session's events (event-journal.ts). */
  private readonly journal: EventJournal;
  /** Waiting messages and where each goes (mailbox.ts). */
  private readonly mailbox = new Mailbox();
  /** The quiet window of the collection gathering in the mailbox (collect mode). */
  private collectTimer?: NodeJS.Timeout;
  private createdMs = Date.now();
  /** Model, reasoning effort and reset point chosen for the session (settle). */
  readonly choices = new SessionChoices();
  private updatedMs = Date.now();
  /** What becomes of incoming frames, and their acknowledgements (admission.ts; admitFrame carries them in). */
  private readonly admission = new Admission();
  private activeMs = Date.now();
  /** Restarts from the log after a run that threw, and the failed state (supervision.ts). */
  protected readonly supervision = new Supervision();
  /** Appends to the log; a failed one loses the session (session-writes.ts). */
  private readonly writes: SessionWrites;
  /** The turn lock: one run at a time (run-slot.ts); `schedule` starts runs in it. */
  private readonly slot = new RunSlot();
  /** Where the session stands (lifecycle.ts); changed only by `happen`. */
  private phase: Phase = "idle";
  /** The run owed while `resuming`: one its runner died in (recovery.ts cutRunOf), or one whose wait ended. */
  private owedResume?: Resume;
  /** The latest compaction: what the model sees in place of the messages before the cut. */
  private compaction?: Compaction;
  /** The calls the open run holds for a decision or a client's result, and the client's tools (held-calls.ts). */
  private readonly held: HeldCalls;
  private idleWaiters: (() => void)[] = [];
  /** Why the session is lost here (phase `lost`): another runner took it (ABORTED), or its log failed (UNAVAILABLE). */
  private lost?: RpcError;
  /** Called once when the session is lost, so the registry forgets this actor. */
  onLost?: () => void;

  private constructor(
    readonly sessionId: string,
    readonly agentId: string,
    /** The tenant and principal the session belongs to; only they may use it. */
    readonly owner: SessionOwner,
    private readonly log: SessionLog,
    private readonly deps: ActorDeps,
    /** Set when the session is a sub-agent's (delegate_task): its parent, depth and instruction. */
    readonly subagent?: Subagent,
  ) {
    // Each part's host is one small object whose methods are on its prototype (actor-hosts.ts):
    // an idle actor holds no closures for them.
    const self = this as unknown as ActorInternals;
    this.writes = new SessionWrites(log, refOf(owner, sessionId), deps.store, new WritesHost(self));
    this.journal = new EventJournal(sessionId, this.writes);
    this.held = new HeldCalls(new HeldCallsHostOf(self));
  }

  /** The session as its owner names it (the store's and the registry's key). */
  get ref(): SessionRef {
    return refOf(this.owner, this.sessionId);
  }

  static async create(
    sessionId: string,
    agentId: string,
    owner: SessionOwner,
    deps: ActorDeps,
    subagent?: Subagent,
  ): Promise<SessionActor> {
    // The first block of seqs is reserved in the log's first write: events reach clients before
    // the log has them (why: docs/architecture.md, the session actor). A new session owes nothing.
    const opening: LogRecord[] = [{ t: "seq", upTo: SEQ_BLOCK }, { t: "settled" }];
    const log = await deps.store.create(refOf(owner, sessionId), agentId, owner, subagent, opening);
    const actor = new SessionActor(sessionId, agentId, owner, log, deps, subagent);
    actor.writes.knownSettled();
    actor.journal.resumeAt(0, SEQ_BLOCK);
    return actor;
  }

  /** Rebuilds the actor from its log. A run the log shows as unfinished was cut off by a crash. */
  static async load(ref: SessionRef, deps: ActorDeps): Promise<SessionActor> {
    const { log, records, corruptLines } = await deps.store.activate(ref);
    const head = records[0];
    if (head?.t !== "session") {
      await log.close();
      throw new Error(`session log ${ref.sessionId} has no header`);
    }
    const actor = new SessionActor(ref.sessionId, head.agentId, ownerOf(head), log, deps, head.subagent);
    if (settledLog(records)) actor.writes.knownSettled();
    actor.createdMs = head.createdMs;
    // Recovery publishes events at once (acknowledgements owed, a resumed run), before the log
    // has them: their seqs are reserved durably first, so no seq is ever handed out twice.
    const resumeAt = resumeSeq(records);
    try {
      await log.append({ t: "seq", upTo: resumeAt + SEQ_BLOCK }, true);
    } catch (err) {
      await log.close().catch(() => undefined);
      throw err;
    }
    actor.replayLog(records, { resumeAt, reservedUpTo: resumeAt + SEQ_BLOCK });
    if (corruptLines.length > 0) {
      const message = `session log lines ${corruptLines.join(", ")} were damaged and skipped; what they held is missing from this session`;
      deps.logger.error(message, { session: ref.sessionId });
      actor.emit({ case: "error", value: { code: "LOG_CORRUPT", message, retryable: false } });
    }
    return actor;
  }

  /** Rebuilds state from the log (session-rebuild.ts), then lets go of what is unseen and runs what is owed. */
  private replayLog(records: LogRecord[], numbering: Numbering, cutOff: CutOff = INTERRUPTED): void {
    this.owedResume = rebuildFromLog(this.rebuildParts, records, numbering, cutOff);
    this.happen(this.owedResume ? "rebuiltCutOff" : this.held.suspended ? "rebuiltWaiting" : "rebuiltIdle");
    this.releaseUnseen();
    // In a restart the failed run's own ending schedules what is next.
    if (!("live" in numbering)) this.schedule();
  }

  /** What a rebuild from the log writes into. */
  private get rebuildParts(): RebuiltParts {
    return {
      mailbox: this.mailbox,
      choices: this.choices,
      history: this.history,
      admission: this.admission,
      journal: this.journal,
      restored: (compaction, updatedMs) => {
        this.compaction = compaction;
        this.updatedMs = updatedMs ?? this.updatedMs;
      },
      emit: (payload) => this.emit(payload),
      asRun: (turnId, close) => this.slot.asRun(turnId, close),
      waiting: (waits) => this.held.restoreWaits(waits),
      decide: (frame) => this.held.take(frame),
      clientTools: (session, run) => this.held.restoreTools(session, run),
    };
  }

  /** Admits one frame (not `open`) and resolves to its frame_accepted event once it is durable. */
  submit(frame: ClientFrame, traceContext: Context = ROOT_CONTEXT): Promise<AgentEvent> {
    validateFrame(frame, true);
    this.activeMs = Date.now();
    return admitFrame(this as unknown as ActorInternals, frame, traceContext);
  }

  /**
   * Sets the session's default queue mode, model and reasoning effort, each when given and
   * changed, and with `reset` starts its conversation over (the model sees nothing before it): in
   * one log record. The caller has checked that the agent allows the model.
   */
  async settle(
    s: { queueMode?: QueueMode; clientTools?: ClientTool[]; clearClientTools?: boolean } & Choice,
  ): Promise<void> {
    const changed: { queueMode?: number; clientTools?: ClientToolRecord[] } & ChoiceRecord = this.choices.apply(
      s,
      this.history.length,
    );
    if (s.clearClientTools || (s.clientTools?.length ?? 0) > 0) {
      const refused = this.held.setSessionTools(s.clearClientTools ? [] : clientToolSpecs(s.clientTools ?? []));
      if (refused) throw refused;
      changed.clientTools = (s.clearClientTools ? [] : (s.clientTools ?? [])).map((t) => ({
        name: t.name,
        description: t.description,
        parametersJson: t.parametersJson,
      }));
    }
    if (s.queueMode && s.queueMode !== this.mailbox.mode) changed.queueMode = this.mailbox.mode = s.queueMode;
    if (Object.keys(changed).length > 0) await this.writes.appendOrRefuse({ t: "settings", ...changed }, true);
    if (changed.contextFrom !== undefined) this.releaseUnseen();
  }

  /**
   * Puts a conversation the client held (OpenSession.history) in a new session's history, as
   * messages said before its first run: each a message_start and message_end, durable before
   * this resolves. Refused once the session has a message or a run (an open that finds a session
   * with none, a new one or one made empty, may bring it).
   */
  async seed(history: readonly ChatMessage[]): Promise<void> {
    if (history.length === 0) return;
    if (this.history.length > 0 || this.running || this.waiting > 0)
      throw invalidArgument(`session ${this.sessionId} has messages: history is taken only by a session without any`);
    const host = { emit: (p: EventPayload) => void this.emit(p), messages: this.history.messages };
    const time = timestampFromMs(Date.now());
    for (const m of history) pushMessage(host, create(ChatMessageSchema, { ...m, id: newId(), time, frameId: "" }));
    await this.journal.delivered();
  }

  /** The default queue mode new messages take. */
  get queueMode(): QueueMode {
    return this.mailbox.mode;
  }

  /** Tells every subscriber these messages will not run (a replay leaves them out too). */
  protected drop(queued: Queued[], message: string): void {
    for (const q of queued) this.emit({ case: "error", value: { code: "CANCELLED", message, frameId: q.frameId } });
  }

  get running(): boolean {
    return runGoing(this.phase);
  }

  /** The open run said it waits (RunWaiting), and has not gone on; its phase is `waiting` once it has returned. */
  get waitingOnDecision(): boolean {
    return this.held.suspended;
  }

  /** Moves the phase as lifecycle.ts's table says; a happening its phase does not expect is a bug, logged. */
  private happen(happening: Happening): void {
    const to = nextPhase(this.phase, happening);
    if (to) this.phase = to;
    else this.deps.logger.error(UNEXPECTED, { session: this.sessionId, phase: this.phase, happening });
  }

  /** Where the session stands, as SessionInfo says it. */
  get state(): SessionState {
    return sessionStateOf(this.phase, this.mailbox.empty);
  }

  /** Messages waiting in this session's mailbox. */
  get waiting(): number {
    return this.mailbox.depth;
  }

  /** Nothing will happen without something from outside: no run going or owed (a run that waits counts as none). */
  get idle(): boolean {
    return idleIn(this.phase, this.mailbox.empty, this.slot.busy);
  }

  /** Nothing running, waiting, arriving or watching: the actor may leave memory (a waiting run's deadline is its timer). */
  get passivatable(): boolean {
    const resting = atRest(this.phase) && this.mailbox.empty && this.held.waits === undefined;
    return resting && this.journal.subscriberCount === 0 && this.admission.admitting === 0;
  }

  /** Last time anything happened in or to this actor. */
  get lastActiveMs(): number {
    return Math.max(this.activeMs, this.journal.lastPublishedMs);
  }

  /** Resolves once no run is going, nothing waits for one, and subscribers have every event. */
  async whenIdle(): Promise<void> {
    if (!this.idle) await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    await this.journal.delivered();
  }

  /**
   * Starts what runs next when the turn lock is open: the run owed first, then the mailbox's next
   * batch; nothing beside a run that waits. The run's end frees the lock and looks again.
   */
  protected schedule(): void {
    if (!this.slot.open) return;
    const resume = this.phase === "resuming" ? this.owedResume : undefined;
    const first = resume ? [] : this.phase === "idle" ? this.mailbox.queue.shift() : undefined;
    if (!first) {
      this.nothingOwed();
      return;
    }
    this.owedResume = undefined;
    const signal = this.slot.take(resume?.turnId ?? newId());
    this.happen("runStarted");
    this.deps.runs?.started(this.owner.tenant);
    this.slot.runs(
      this.execute({ first, resume }, signal).finally(() => {
        this.slot.release();
        this.runEnded();
        this.schedule();
      }),
    );
  }

  /** A run has ended and the lock is free. */
  private runEnded(): void {
    this.happen(this.held.suspended ? "runStoppedToWait" : "runEnded");
    this.deps.runs?.ended(this.owner.tenant);
    // Steering or follow-ups that came too late for the run are not lost: they run next. A run
    // that stopped to wait keeps them: steering ends its wait, follow-ups join it.
    if (!this.held.suspended) this.mailbox.requeueLate();
    this.releaseUnseen();
    // What came while the run was stopping (a decision, steering) may already end its wait.
    this.held.goOnIfDue();
  }

  /** Nothing was owed when `schedule` looked: the session may be idle, and then settled in its log. */
  private nothingOwed(): void {
    this.journal.trimIdle();
    if (!this.idle) return;
    // A run that waits is owed its deadline, which a runner taking over must keep; a run handed
    // over is owed its end: neither is settled.
    if (atRest(this.phase) && this.held.waits === undefined) this.writes.settle();
    for (const wake of this.idleWaiters.splice(0)) wake();
  }

  /**
   * Lets go of the held messages the model will not see again (HeldHistory). Only between runs,
   * and not while a resume waits: a run's indexes into the held messages must stay put. Called
   * where what the model sees can have moved: a run's end, a replay's end, a reset.
   */
  private releaseUnseen(): void {
    if (!atRest(this.phase) || this.held.waits) return;
    this.compaction = this.history.releaseUnseen(this.compaction, this.choices.contextFrom);
  }

  /** Messages [offset, offset + size) of the whole history; what was let go is read from the log. */
  historyPage(offset: number, size: number): Promise<ChatMessage[]> {
    return this.history.page(offset, size, async () => {
      await this.log.flush();
      return replayRecords(await this.writes.read()).messages;
    });
  }

  /** Runs one run to its end. Never rejects: a run that throws is a bug, and supervision restarts the actor. */
  private async execute({ first, resume }: NextRun, signal: AbortSignal): Promise<void> {
    const { history } = this;
    if (!resume) this.held.startRun(first.map((q) => q.clientTools));
    const released = history.released;
    try {
      // A resume's index is absolute (the log's); nothing is let go while a resume waits.
      const resumeAt = resume && { ...resume, from: resume.from - released };
      const starters = resumeAt ? resumedMessages(history.messages, resumeAt.from) : first;
      const host = runHostOf(this as unknown as ActorInternals, signal);
      const outcome = await runAgent(host, this.deps.runDeps(this, starters), first, resumeAt);
      if (outcome.waiting && this.held.waits) this.held.waits.from = outcome.waiting.from + released;
    } catch (err) {
      // Not a model or tool failure (those end runs normally): a bug. Its state is suspect, so
      // the actor rebuilds itself from its log; other sessions are untouched.
      this.deps.logger.error("run failed unexpectedly; restarting the session from its log", {
        session: this.sessionId,
        ...failure(err),
      });
      this.happen("runThrew");
      await restartFromLog(this as unknown as ActorInternals, first);
    }
  }

  private emit(payload: EventPayload): AgentEvent {
    // A handed-over run's last moments are not recorded or sent: its next runner redoes them.
    if (this.phase === "handedOver") return create(AgentEventSchema, { sessionId: this.sessionId, payload });
    const event = this.journal.number(payload, this.slot.turnId ?? "");
    // What the open run waits on, and the latest compaction, follow each event before any subscriber sees it.
    this.held.published(event);
    if (event.payload.case === "compactionEnd") {
      const { summary, firstKeptMessageId } = event.payload.value;
      this.compaction = { summary, firstKeptMessageId };
    }
    this.journal.publish(event);
    return event;
  }

  /**
   * The session cannot go on here (another runner took it, or its log failed): the run is aborted,
   * streams end with `err` so clients reconnect through the router, the registry forgets the actor.
   */
  private loseSession(err: RpcError, why: string): void {
    if (this.lost) return;
    this.lost = err;
    this.happen("lose");
    this.held.stop();
    this.deps.logger.warn(why, { session: this.sessionId });
    void this.slot.stop(err);
    clearTimeout(this.collectTimer);
    this.journal.closeAll(err);
    for (const wake of this.idleWaiters.splice(0)) wake();
    this.onLost?.();
  }

  /** Adds a subscriber, first sending what the session holds after `afterSeq` (EventJournal.attach). */
  async attach(sub: EventSubscriber, afterSeq?: number): Promise<void> {
    if (this.lost) throw this.lost;
    this.activeMs = Date.now();
    await this.journal.attach(sub, afterSeq);
    if (this.lost) {
      this.journal.detach(sub);
      throw this.lost;
    }
  }

  detach(sub: EventSubscriber): void {
    this.activeMs = Date.now();
    this.journal.detach(sub);
  }

  info(): SessionInfo {
    return create(SessionInfoSchema, {
      sessionId: this.sessionId,
      agentId: this.agentId,
      createTime: timestampFromMs(this.createdMs),
      updateTime: timestampFromMs(Math.max(this.updatedMs, this.journal.lastPublishedMs)),
      lastSeq: BigInt(this.journal.lastSeq),
      messageCount: this.history.length,
      running: this.running,
      state: this.state,
      pending: this.held.pending().map((h) => pendingCallOf(h, this.owner.principal)),
    });
  }

  get lastSeq(): number {
    return this.journal.lastSeq;
  }

  /** Starts no new run from now on; resolves when the one going (if any) has ended. */
  drain(): Promise<void> {
    return this.slot.drain();
  }

  /**
   * Stops the run and closes the log. `handOver`: nothing more of the run is recorded (the next
   * load resumes it); `exiting` too (the process is stopping): a run handed over keeps its lease
   * until the process is gone, so a runner's sweep for orphans resumes it, not only its session's
   * next call. `end`: streams end with it.
   */
  async close(options: { handOver?: boolean; exiting?: boolean; end?: RpcError } = {}): Promise<void> {
    // A run that waits is handed over like a running one: its next runner keeps its deadline.
    const handedOver = options.handOver === true && (runGoing(this.phase) || this.held.waits !== undefined);
    this.happen(handedOver ? "handOver" : "close");
    this.held.stop();
    const ended = this.slot.stop(new Error("runner shutting down"));
    clearTimeout(this.collectTimer);
    await ended;
    this.journal.flushDelta();
    await this.log.append({ t: "closed", seq: this.journal.lastSeq }, true).catch(() => undefined);
    await this.log.close({ keepLease: handedOver && options.exiting === true });
    if (options.end) this.loseSession(options.end, "session handed over");
  }
}
