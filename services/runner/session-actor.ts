// One actor per session. It owns the session's state (conversation, seq, queues), admits client
// frames in arrival order, runs one agent run at a time (the turn lock), and publishes every event
// to the streams attached to it. A frame is acknowledged only after it is durably in the log.
import { create, fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { timestampFromMs, timestampNow } from "@bufbuild/protobuf/wkt";
import { ROOT_CONTEXT, type Context } from "@opentelemetry/api";
import {
  AgentEventSchema,
  ChatMessageSchema,
  ClientFrameSchema,
  QueueMode,
  Role,
  SessionInfoSchema,
  StopReason,
  type AgentEvent,
  type ChatMessage,
  type ClientFrame,
  type SessionInfo,
} from "../shared/gen/troupe/v1/session_pb.js";
import { FRAME_KIND, validateFrame } from "../shared/frames.js";
import { RpcError, Status, failedPrecondition, resourceExhausted, statusName, unavailable } from "../shared/errors.js";
import { newId } from "../shared/ids.js";
import type { Logger } from "../shared/log.js";
import { contextFromRecord } from "../shared/telemetry.js";
import { injectUserMessages, runAgent } from "./loop.js";
import type { Compaction, EventPayload, QueuedMessage, RunDeps, RunHost } from "./run.js";
import type { AuditLog } from "./audit-log.js";
import { refOf, type SessionRef } from "../shared/session-ref.js";
import type { TenantRuns } from "./tenant-runs.js";
import {
  ownerOf,
  type LogRecord,
  type SessionLog,
  type SessionOwner,
  type SessionStore,
  type Subagent,
} from "./session-log.js";
import { SessionElsewhere } from "./session-lease.js";

/** Where an actor's events go: a client stream, seen through its backpressure. */
export interface EventSubscriber {
  send(event: AgentEvent): void;
  /** Pending while the subscriber's stream is full. */
  pressure(): Promise<void> | undefined;
  /** The actor can serve it no more (the session moved to another runner): end with `err`. */
  close(err: RpcError): void;
}

export interface ActorDeps {
  store: SessionStore;
  audit: AuditLog;
  logger: Logger;
  /** What a run of this actor's session uses (model, tools, prompt, hooks). */
  runDeps(actor: SessionActor): RunDeps;
  /** Runs going per tenant (the concurrentRuns quota); none: no quota. */
  runs?: TenantRuns;
}

/** Recent events (deltas included) kept in memory for resuming clients. */
const RING_SIZE = 4096;
/**
 * What the ring keeps once the session is idle. Everything but token deltas is in the log, so a
 * client resuming from further back loses only deltas (reported as a gap); thousands of idle
 * sessions must not each hold a full ring.
 */
const IDLE_RING_SIZE = 64;
/**
 * seq values are reserved in the log in blocks, so a restart never reuses one a client saw. A
 * session's first block is written with its header; the next is reserved when the current one is
 * half used, which leaves its write the time of 512 events to land before its seqs go out.
 */
const SEQ_BLOCK = 1024;
/**
 * Largest text one coalesced delta event carries. Stream buffers along the way (grpc-js, Node
 * streams) count messages, not bytes: bounding the message bounds what backpressure lets pile up.
 */
const MAX_DELTA_CHARS = 16 * 1024;
/** Messages a session holds waiting (queued, steering, follow-ups, collecting) before it refuses more. */
export const MAILBOX_LIMIT = 100;
/** Supervision: this many unexpected run failures within RESTART_WINDOW_MS mark the session failed. */
export const RESTART_LIMIT = 5;
export const RESTART_WINDOW_MS = 60_000;
/** Collect mode: prompts that arrive within this quiet window run together. */
export const COLLECT_WINDOW_MS = 500;
/** Token deltas and partial tool output are not persisted; the complete messages are. */
const TRANSIENT: ReadonlySet<EventPayload["case"]> = new Set(["messageUpdate", "toolExecutionUpdate"]);

interface CutOff {
  reason: StopReason;
  message: string;
  /** The messages that started the cut-off run (known when this process saw it fail). */
  startedBy?: QueuedMessage[];
}
const INTERRUPTED: CutOff = { reason: StopReason.INTERRUPTED, message: "the runner stopped while this run was going" };

interface Queued extends QueuedMessage {
  arrival: number;
}

/**
 * The seq a reloaded session numbers on from. After a clean close the log knows the last seq; after
 * a crash, seqs up to the reservation may have reached clients, so numbering continues past it (a
 * replay reports the jump as a gap). A clean close counts if nothing but the next activations'
 * epoch records followed it.
 */
function resumeSeq(records: readonly LogRecord[]): number {
  let last = 0;
  let reserved = 0;
  let closedAt: number | undefined;
  for (const rec of records) {
    if (rec.t !== "epoch") closedAt = rec.t === "closed" ? rec.seq : undefined;
    if (rec.t === "seq") reserved = Math.max(reserved, rec.upTo);
    else if (rec.t === "event") last = Math.max(last, Number((rec.event as { seq?: string }).seq ?? 0));
  }
  return Math.max(last, closedAt ?? reserved);
}

/** A frame the session would not take (mailbox full, reject mode); nothing of it was recorded. */
/** A frame the session did not take; it keeps the refusal's trailers (a retry hint). */
export class FrameRefused extends RpcError {
  constructor(
    code: Status,
    message: string,
    private readonly carried: Record<string, string> = {},
  ) {
    super(code, message);
  }
  override get trailers(): Record<string, string> {
    return this.carried;
  }
}

export class SessionActor {
  readonly messages: ChatMessage[] = [];
  private seq = 0;
  private reservedUpTo = 0;
  private createdMs = Date.now();
  private updatedMs = Date.now();
  private arrivals = 0;
  /** frame_id -> its acknowledgement, so a resent frame is acknowledged without acting again. */
  private readonly acks = new Map<string, Promise<AgentEvent>>();
  /** Runs waiting for the turn lock, each one or more messages, in order of arrival. */
  private readonly queue: Queued[][] = [];
  /** Collect mode: prompts gathered until the quiet window passes. */
  private collecting: Queued[] = [];
  private collectTimer?: NodeJS.Timeout;
  private queueMode = QueueMode.STEER;
  /** Frames between their mailbox check and their place in a queue (their log write in flight). */
  private admitting = 0;
  private activeMs = Date.now();
  /** Times of recent unexpected run failures (supervision). */
  private restarts: number[] = [];
  /** Set when the session gave up after too many failures: why. */
  private failed?: string;
  /** Pending while a restart rebuilds state from the log; admissions wait for it. */
  private restarting?: Promise<void>;
  /** Messages for the running run: steering (next boundary) and follow-ups (after it). */
  private readonly steering: Queued[] = [];
  private readonly followUps: Queued[] = [];
  private run?: { turnId: string; controller: AbortController; done: Promise<void> };
  /** The latest compaction: what the model sees in place of the messages before the cut. */
  private compaction?: Compaction;
  private readonly subscribers = new Set<EventSubscriber>();
  private readonly ring: AgentEvent[] = [];
  private pendingDelta?: { messageId: string; kind: "text" | "thinking"; text: string };
  private flushScheduled = false;
  private idleWaiters: (() => void)[] = [];
  private closing = false;
  /**
   * Set once the session is lost here: another runner took it (ABORTED), or its log could not be
   * written (UNAVAILABLE). From then on this actor only refuses; the next call loads it anew.
   */
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
  ) {}

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
    // The first block of seqs is reserved in the log's first write. Events reach clients before
    // the log has them, so a reservation made at the first event would be in flight while its
    // seqs were already out: a runner killed then left no trace of them, and the next activation
    // numbered from 1 again, giving clients new events under seqs they held (a resuming client
    // skipped them as seen).
    const log = await deps.store.create(refOf(owner, sessionId), agentId, owner, subagent, [
      { t: "seq", upTo: SEQ_BLOCK },
    ]);
    const actor = new SessionActor(sessionId, agentId, owner, log, deps, subagent);
    actor.reservedUpTo = SEQ_BLOCK;
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
    actor.createdMs = head.createdMs;
    // Recovery publishes events at once (a cut-off run's end, acknowledgements owed), and clients
    // see them before the log does. Their seqs must be reserved durably first: a process that died
    // before its first write would otherwise leave the next activation to hand the same seqs out
    // again, for other events, to clients that already hold them.
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

  /**
   * Rebuilds state from the log. Numbering goes on from `live` when this process already numbered
   * events (a restart in place, whose reservation covers it), else from `resumeAt` (resumeSeq of
   * these records) under the reservation load() made durable.
   */
  private replayLog(
    records: LogRecord[],
    numbering: { live: number } | { resumeAt: number; reservedUpTo: number },
    cutOff: CutOff = INTERRUPTED,
  ): void {
    const accepted = new Map<string, ClientFrame>();
    /** Frames dropped on request (an abort that cleared the queue, a failed session). */
    const dropped = new Set<string>();
    let openTurn: string | undefined;
    for (const rec of records) {
      if (rec.t === "settings") this.queueMode = rec.queueMode;
      else if (rec.t === "frame") {
        const frame = fromJson(ClientFrameSchema, rec.frame as JsonValue);
        accepted.set(frame.frameId, frame);
      } else if (rec.t === "event") {
        const ev = fromJson(AgentEventSchema, rec.event as JsonValue);
        this.seq = Math.max(this.seq, Number(ev.seq));
        this.updatedMs = ev.time ? Number(ev.time.seconds) * 1000 + Math.floor(ev.time.nanos / 1e6) : this.updatedMs;
        const p = ev.payload;
        if (p.case === "messageEnd" && p.value.message) this.messages.push(p.value.message);
        else if (p.case === "frameAccepted" && !p.value.duplicate) this.acks.set(p.value.frameId, Promise.resolve(ev));
        else if (p.case === "error" && p.value.code === "CANCELLED" && p.value.frameId) dropped.add(p.value.frameId);
        else if (p.case === "messageBlocked") dropped.add(p.value.frameId);
        else if (p.case === "compactionEnd")
          this.compaction = { summary: p.value.summary, firstKeptMessageId: p.value.firstKeptMessageId };
        else if (p.case === "agentStart") openTurn = ev.turnId;
        else if (p.case === "agentEnd") openTurn = undefined;
      }
    }
    if ("live" in numbering) {
      this.seq = Math.max(this.seq, numbering.live);
    } else {
      this.seq = numbering.resumeAt;
      this.reservedUpTo = numbering.reservedUpTo;
    }
    // Every accepted message is in the history, or was dropped on request, or is owed a run.
    const inHistory = new Set(this.messages.filter((m) => m.role === Role.USER).map((m) => m.frameId));
    if (openTurn !== undefined) {
      // A failed run's starting messages are kept (in history, once) but not run again: they may
      // be what triggers the failure. After a crash they run again, having never really started.
      const starters = (cutOff.startedBy ?? []).filter((q) => !inHistory.has(q.frameId) && !dropped.has(q.frameId));
      for (const q of starters) inHistory.add(q.frameId);
      this.closeCutOffRun(openTurn, cutOff.reason, cutOff.message, starters);
    }
    for (const frame of accepted.values()) {
      if (inHistory.has(frame.frameId) || dropped.has(frame.frameId)) continue;
      const q = this.toQueued(frame, ROOT_CONTEXT);
      if (q) this.queue.push([q]);
      if (!this.acks.has(frame.frameId)) {
        this.acks.set(
          frame.frameId,
          Promise.resolve(
            this.emit({ case: "frameAccepted", value: { frameId: frame.frameId, kind: FRAME_KIND[frame.kind.case!] } }),
          ),
        );
      }
    }
    // In a restart the failed run's own ending schedules what is next.
    if (!("live" in numbering)) this.schedule();
  }

  /** Closes a run that was cut off (crash, or a failure): every tool call gets a result, then agent_end. */
  private closeCutOffRun(
    turnId: string,
    reason: StopReason,
    message: string,
    unappliedStarters: QueuedMessage[] = [],
  ): void {
    this.run = { turnId, controller: new AbortController(), done: Promise.resolve() };
    injectUserMessages({ emit: (payload) => void this.emit(payload), messages: this.messages }, unappliedStarters);
    const answered = new Set(this.messages.filter((m) => m.role === Role.TOOL).map((m) => m.toolCallId));
    for (const m of [...this.messages]) {
      for (const call of m.role === Role.ASSISTANT ? m.toolCalls : []) {
        if (answered.has(call.id)) continue;
        const result = create(ChatMessageSchema, {
          id: newId(),
          role: Role.TOOL,
          toolCallId: call.id,
          toolName: call.name,
          text: `Interrupted: ${message}.`,
          isError: true,
          time: timestampNow(),
        });
        this.emit({
          case: "toolExecutionEnd",
          value: { toolCallId: call.id, toolName: call.name, result: result.text, isError: true },
        });
        this.emit({ case: "messageEnd", value: { message: result } });
        this.messages.push(result);
      }
    }
    this.emit({ case: "agentEnd", value: { stopReason: reason, errorMessage: message } });
    this.run = undefined;
  }

  // -------------------------------------------------------------------------------------------
  // Frames

  /** Admits one frame (not `open`) and resolves to its frame_accepted event once it is durable. */
  submit(frame: ClientFrame, traceContext: Context = ROOT_CONTEXT): Promise<AgentEvent> {
    validateFrame(frame, true);
    this.activeMs = Date.now();
    if (this.lost) return Promise.reject(this.lost);
    if (this.failed && frame.kind.case !== "abort") {
      return Promise.reject(
        this.refuse(frame, failedPrecondition(`session ${this.sessionId} has failed: ${this.failed}`)),
      );
    }
    const earlier = this.acks.get(frame.frameId);
    if (earlier) {
      const kind = FRAME_KIND[frame.kind.case!];
      return earlier.then(() =>
        this.emit({ case: "frameAccepted", value: { frameId: frame.frameId, kind, duplicate: true } }),
      );
    }
    const ack = this.admit(frame, traceContext);
    this.acks.set(frame.frameId, ack);
    ack.catch(() => this.acks.delete(frame.frameId));
    return ack;
  }

  private async admit(frame: ClientFrame, traceContext: Context): Promise<AgentEvent> {
    // While the actor rebuilds itself from its log the mailbox waits, in arrival order.
    while (this.restarting) await this.restarting;
    const kind = frame.kind;
    if (this.failed && kind.case !== "abort")
      throw this.refuse(frame, failedPrecondition(`session ${this.sessionId} has failed: ${this.failed}`));
    // Refusals come before the frame is recorded: a refused frame leaves no trace but the error.
    if (kind.case !== "abort" && this.waiting() + this.admitting >= MAILBOX_LIMIT) {
      throw this.refuse(
        frame,
        resourceExhausted(
          `session ${this.sessionId} has ${MAILBOX_LIMIT} messages waiting; retry when its runs have caught up`,
        ),
      );
    }
    if (kind.case === "prompt" && this.run && this.modeOf(kind.value.queueMode) === QueueMode.REJECT) {
      throw this.refuse(
        frame,
        failedPrecondition(`a run is going in session ${this.sessionId} and this prompt's queue mode is reject`),
      );
    }
    // A message that would start a run in an idle session waits for its tenant's quota of runs.
    if (kind.case !== "abort" && this.idle) {
      try {
        this.deps.runs?.admit(this.owner.tenant);
      } catch (err) {
        throw this.refuse(frame, err as RpcError);
      }
    }
    // The log serialises appends, so frames are admitted in the order they arrived.
    const counted = kind.case !== "abort";
    if (counted) this.admitting++;
    try {
      await this.log.append({ t: "frame", frame: toJson(ClientFrameSchema, frame) }, true);
    } catch (err) {
      if (err instanceof SessionElsewhere) {
        this.loseSession(err, `session ${this.sessionId} was taken over by another runner; dropping it here`);
        throw err;
      }
      // Not acknowledged, so the client resends; the session reloads from its log on the next call.
      const lost = this.storageFailed(err);
      throw lost;
    } finally {
      if (counted) this.admitting--;
    }
    const q = this.toQueued(frame, traceContext);
    let position = 0;
    let interrupt = false;
    if (kind.case === "abort") {
      // handled after the acknowledgement, below
    } else if (!this.run) {
      this.queue.push([q!]);
      position = this.queue.length - 1;
    } else if (kind.case === "steer") {
      this.steering.push(q!);
    } else if (kind.case === "followUp") {
      // A follow-up joins the running run after its last step, unless runs already wait ahead of it.
      if (this.queue.length === 0 && this.collecting.length === 0) this.followUps.push(q!);
      else this.queue.push([q!]);
      position = this.queue.length + 1;
    } else if (kind.case === "prompt") {
      switch (this.modeOf(kind.value.queueMode)) {
        case QueueMode.FOLLOWUP:
          this.queue.push([q!]);
          position = this.queue.length;
          break;
        case QueueMode.COLLECT:
          this.collecting.push(q!);
          clearTimeout(this.collectTimer);
          this.collectTimer = setTimeout(() => this.closeCollection(), COLLECT_WINDOW_MS);
          position = this.queue.length + 1;
          break;
        case QueueMode.INTERRUPT:
          this.queue.unshift([q!]);
          position = 0;
          interrupt = true;
          break;
        default:
          this.steering.push(q!);
      }
    }
    const ack = this.emit({
      case: "frameAccepted",
      value: { frameId: frame.frameId, kind: FRAME_KIND[kind.case!], queuePosition: position },
    });
    if (kind.case === "abort") this.abort(frame.frameId, kind.value.reason, kind.value.clearQueue);
    if (interrupt && this.run) this.abort(frame.frameId, "interrupted by a prompt in interrupt mode", false);
    this.schedule();
    return ack;
  }

  private modeOf(mode: QueueMode): QueueMode {
    return mode === QueueMode.UNSPECIFIED ? this.queueMode : mode;
  }

  private waiting(): number {
    let n = this.steering.length + this.followUps.length + this.collecting.length;
    for (const group of this.queue) n += group.length;
    return n;
  }

  /** Tells every subscriber why a frame was refused (the caller gets the status too). */
  private refuse(frame: ClientFrame, err: RpcError): FrameRefused {
    this.emit({
      case: "error",
      value: {
        code: statusName(err.code),
        message: err.message,
        retryable: err.code === Status.RESOURCE_EXHAUSTED,
        frameId: frame.frameId,
      },
    });
    return new FrameRefused(err.code, err.message, err.trailers);
  }

  /** The quiet window passed: the gathered prompts become one run. */
  private closeCollection(): void {
    this.collectTimer = undefined;
    if (this.collecting.length === 0) return;
    this.queue.push(this.collecting);
    this.collecting = [];
    this.schedule();
  }

  /** Sets the session's default queue mode (kept in the log). */
  async setQueueMode(mode: QueueMode): Promise<void> {
    if (mode === QueueMode.UNSPECIFIED || mode === this.queueMode) return;
    this.queueMode = mode;
    await this.log.append({ t: "settings", queueMode: mode }, true);
  }

  private toQueued(frame: ClientFrame, traceContext: Context): Queued | undefined {
    const k = frame.kind;
    if (k.case !== "prompt" && k.case !== "steer" && k.case !== "followUp") return undefined;
    const ctx = Object.keys(frame.traceContext).length > 0 ? contextFromRecord(frame.traceContext) : traceContext;
    const instruction = k.case === "prompt" && k.value.instruction !== "" ? k.value.instruction : undefined;
    return {
      frameId: frame.frameId,
      kind: FRAME_KIND[k.case],
      text: k.value.text,
      instruction,
      traceContext: ctx,
      arrival: ++this.arrivals,
    };
  }

  private abort(frameId: string, reason: string, clearQueue: boolean): void {
    this.deps.audit
      .record({
        action: "abort",
        sessionId: this.sessionId,
        frameId,
        reason,
        turnId: this.run?.turnId ?? "",
        clearQueue,
      })
      .catch((err: unknown) => this.deps.logger.error("audit log write failed", { error: String(err) }));
    if (clearQueue) {
      clearTimeout(this.collectTimer);
      const dropped = [
        ...this.steering.splice(0),
        ...this.followUps.splice(0),
        ...this.queue.splice(0).flat(),
        ...this.collecting.splice(0),
      ];
      for (const q of dropped.sort((a, b) => a.arrival - b.arrival)) {
        this.emit({
          case: "error",
          value: {
            code: "CANCELLED",
            message: `dropped by an abort that cleared the queue${reason ? `: ${reason}` : ""}`,
            frameId: q.frameId,
          },
        });
      }
    }
    this.run?.controller.abort(new Error(reason || "aborted"));
  }

  // -------------------------------------------------------------------------------------------
  // Runs

  get running(): boolean {
    return this.run !== undefined;
  }

  get idle(): boolean {
    return !this.run && this.queue.length === 0 && this.collecting.length === 0;
  }

  /** Nothing running, waiting, arriving or watching: the actor may leave memory. */
  get passivatable(): boolean {
    return this.idle && this.subscribers.size === 0 && this.admitting === 0 && !this.closing;
  }

  /** Last time anything happened in or to this actor. */
  get lastActiveMs(): number {
    return this.activeMs;
  }

  /** Resolves once no run is going and nothing waits for one. */
  whenIdle(): Promise<void> {
    return this.idle ? Promise.resolve() : new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private schedule(): void {
    if (this.run || this.closing) return;
    const next = this.queue.shift();
    if (!next) {
      if (this.ring.length > IDLE_RING_SIZE) this.ring.splice(0, this.ring.length - IDLE_RING_SIZE);
      // Prompts still gathering (collect mode) are work to come: not idle until they have run.
      if (this.idle) for (const wake of this.idleWaiters.splice(0)) wake();
      return;
    }
    const controller = new AbortController();
    const turnId = newId();
    const run = { turnId, controller, done: Promise.resolve() };
    this.run = run;
    this.deps.runs?.started(this.owner.tenant);
    run.done = this.execute(next, controller.signal).finally(() => {
      this.deps.runs?.ended(this.owner.tenant);
      // Steering or follow-ups that came too late for the run are not lost: they run next.
      const late = [...this.steering.splice(0), ...this.followUps.splice(0)].sort((a, b) => a.arrival - b.arrival);
      if (late.length > 0) this.queue.unshift(late);
      this.run = undefined;
      this.schedule();
    });
  }

  private async execute(first: Queued[], signal: AbortSignal): Promise<void> {
    const host: RunHost = {
      sessionId: this.sessionId,
      signal,
      messages: this.messages,
      emit: (payload) => void this.emit(payload),
      delta: (messageId, kind, text) => this.delta(messageId, kind, text),
      pressure: () => this.pressure(),
      takeSteering: () => this.steering.splice(0),
      takeFollowUps: () => this.followUps.splice(0),
      compaction: () => this.compaction,
    };
    try {
      await runAgent(host, this.deps.runDeps(this), first);
    } catch (err) {
      // Not a model or tool failure (those end runs normally): a bug. Its state is suspect, so
      // the actor rebuilds itself from its log; other sessions are untouched.
      this.deps.logger.error("run failed unexpectedly; restarting the session from its log", {
        session: this.sessionId,
        error: String((err as Error)?.stack ?? err),
      });
      await this.restartFromLog(first);
    }
  }

  /** Supervision: backoff, then state rebuilt from the log; too many failures mark the session failed. */
  private async restartFromLog(startedBy: QueuedMessage[]): Promise<void> {
    const now = Date.now();
    this.restarts = [...this.restarts.filter((t) => now - t < RESTART_WINDOW_MS), now];
    this.emit({
      case: "error",
      value: {
        code: "INTERNAL",
        message: "the run failed unexpectedly; the session restarts from its log",
        retryable: true,
      },
    });
    let done!: () => void;
    this.restarting = new Promise((resolve) => (done = resolve));
    try {
      // New frames wait (see admit); the ones already past that point land in the log first, so
      // the read below holds every accepted frame and the queues rebuilt from it miss none.
      while (this.admitting > 0) await new Promise((r) => setTimeout(r, 5));
      await new Promise((r) => setTimeout(r, 100 * 2 ** (this.restarts.length - 1)));
      await this.log.flush().catch(() => undefined);
      const records = await this.deps.store.read(this.ref);
      const liveSeq = this.seq;
      this.messages.length = 0;
      this.acks.clear();
      this.queue.length = 0;
      this.steering.length = 0;
      this.followUps.length = 0;
      this.collecting = [];
      this.compaction = undefined;
      clearTimeout(this.collectTimer);
      // What was queued comes back from the log (accepted, never applied) and runs after this.
      this.replayLog(
        records,
        { live: liveSeq },
        { reason: StopReason.ERROR, message: "the run failed unexpectedly", startedBy },
      );
      if (this.restarts.length >= RESTART_LIMIT) {
        this.failed = `${this.restarts.length} unexpected failures within ${RESTART_WINDOW_MS / 1000} s; see the runner's log`;
        for (const q of this.queue.splice(0).flat()) {
          this.emit({
            case: "error",
            value: { code: "CANCELLED", message: "dropped: the session failed", frameId: q.frameId },
          });
        }
        this.emit({
          case: "error",
          value: {
            code: "SESSION_FAILED",
            message: `session ${this.sessionId} has failed: ${this.failed}`,
            retryable: false,
          },
        });
      }
    } finally {
      this.restarting = undefined;
      done();
    }
  }

  // -------------------------------------------------------------------------------------------
  // Events

  private emit(payload: EventPayload): AgentEvent {
    this.flushDelta();
    return this.publish(payload);
  }

  private publish(payload: EventPayload): AgentEvent {
    const now = Date.now();
    this.updatedMs = now;
    this.activeMs = now;
    // create() turns the payload's init object into a message.
    const event = create(AgentEventSchema, {
      sessionId: this.sessionId,
      seq: BigInt(++this.seq),
      turnId: this.run?.turnId ?? "",
      time: timestampFromMs(now),
      payload: payload as never,
    });
    if (this.seq >= this.reservedUpTo - SEQ_BLOCK / 2) {
      this.reservedUpTo = this.seq + SEQ_BLOCK;
      this.persist({ t: "seq", upTo: this.reservedUpTo }, true);
    }
    if (!TRANSIENT.has(payload.case))
      this.persist(
        { t: "event", event: toJson(AgentEventSchema, event) },
        payload.case === "agentEnd" || payload.case === "compactionEnd",
      );
    if (event.payload.case === "compactionEnd")
      this.compaction = {
        summary: event.payload.value.summary,
        firstKeptMessageId: event.payload.value.firstKeptMessageId,
      };
    this.ring.push(event);
    if (this.ring.length > RING_SIZE) this.ring.splice(0, this.ring.length - RING_SIZE);
    for (const sub of this.subscribers) sub.send(event);
    return event;
  }

  private persist(record: LogRecord, sync: boolean): void {
    this.log.append(record, sync).catch((err: unknown) => {
      if (err instanceof SessionElsewhere)
        return this.loseSession(err, `session ${this.sessionId} was taken over by another runner; dropping it here`);
      this.storageFailed(err);
    });
  }

  /**
   * A failed write (a full disk) fails every later append of this log: nothing is acknowledged
   * past a hole. The actor leaves memory and gives up its lease, so the next call loads the
   * session again from what is on disk, which succeeds once space is back.
   */
  private storageFailed(err: unknown): RpcError {
    const lost = unavailable(
      `session ${this.sessionId}'s log could not be written (${(err as Error).message ?? err}); retry: it is reloaded from its log on the next call`,
    );
    if (!this.lost) {
      this.loseSession(lost, "session log append failed; the session leaves memory");
      void this.log.close().catch(() => undefined);
    }
    return this.lost ?? lost;
  }

  /**
   * The session cannot go on here: another runner took it (this one was presumed dead), or its
   * log failed. Stop at once: the run is aborted, streams end with `err` so clients reconnect
   * through the router, and the registry forgets the actor. Nothing it writes from now on counts.
   */
  private loseSession(err: RpcError, why: string): void {
    if (this.lost) return;
    this.lost = err;
    this.closing = true;
    this.deps.logger.warn(why, { session: this.sessionId });
    clearTimeout(this.collectTimer);
    this.run?.controller.abort(err);
    for (const sub of this.subscribers) sub.close(err);
    this.subscribers.clear();
    for (const wake of this.idleWaiters.splice(0)) wake();
    this.onLost?.();
  }

  /** Deltas that arrive in one burst (one network read, one event-loop turn) become one event. */
  private delta(messageId: string, kind: "text" | "thinking", text: string): void {
    const p = this.pendingDelta;
    if (p && p.messageId === messageId && p.kind === kind && p.text.length + text.length <= MAX_DELTA_CHARS) {
      p.text += text;
      return;
    }
    this.flushDelta();
    this.pendingDelta = { messageId, kind, text };
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => {
        this.flushScheduled = false;
        this.flushDelta();
      });
    }
  }

  private flushDelta(): void {
    const p = this.pendingDelta;
    if (!p) return;
    this.pendingDelta = undefined;
    this.publish({ case: "messageUpdate", value: { messageId: p.messageId, delta: { case: p.kind, value: p.text } } });
  }

  private pressure(): Promise<void> | undefined {
    let waits: Promise<void>[] | undefined;
    for (const sub of this.subscribers) {
      const p = sub.pressure();
      if (p) (waits ??= []).push(p);
    }
    return waits && Promise.all(waits).then(() => undefined);
  }

  // -------------------------------------------------------------------------------------------
  // Subscribers

  /**
   * Adds a subscriber. With afterSeq, first sends what the session still holds after that seq:
   * from memory when the ring covers it, else the complete events from the log. Live events that
   * happen meanwhile are held back and follow in order, each exactly once.
   */
  async attach(sub: EventSubscriber, afterSeq?: number): Promise<void> {
    if (this.lost) throw this.lost;
    this.activeMs = Date.now();
    if (afterSeq === undefined || afterSeq >= this.seq) {
      this.subscribers.add(sub);
      return;
    }
    const held: AgentEvent[] = [];
    const holder: EventSubscriber = {
      send: (e) => void held.push(e),
      pressure: () => undefined,
      close: (err) => sub.close(err),
    };
    this.subscribers.add(holder);
    let last = afterSeq;
    const forward = (e: AgentEvent) => {
      const seq = Number(e.seq);
      if (seq <= last) return;
      if (seq > last + 1) {
        // Say so rather than leave a hole: the gap event takes the last missing seq.
        sub.send(
          create(AgentEventSchema, {
            sessionId: this.sessionId,
            seq: BigInt(seq - 1),
            turnId: e.turnId,
            time: e.time,
            payload: { case: "gap", value: { firstSeq: BigInt(last + 1) } },
          }),
        );
      }
      sub.send(e);
      last = seq;
    };
    try {
      const floor = this.ring.length > 0 ? Number(this.ring[0].seq) : this.seq + 1;
      if (afterSeq + 1 < floor) {
        for (const rec of await this.deps.store.read(this.ref)) {
          if (rec.t !== "event") continue;
          const e = fromJson(AgentEventSchema, rec.event as JsonValue);
          if (Number(e.seq) < floor) forward(e);
        }
      }
      for (const e of this.ring) forward(e);
      for (const e of held) forward(e);
    } finally {
      this.subscribers.delete(holder);
    }
    if (this.lost) throw this.lost;
    this.subscribers.add(sub);
  }

  detach(sub: EventSubscriber): void {
    this.activeMs = Date.now();
    this.subscribers.delete(sub);
  }

  info(): SessionInfo {
    return create(SessionInfoSchema, {
      sessionId: this.sessionId,
      agentId: this.agentId,
      createTime: timestampFromMs(this.createdMs),
      updateTime: timestampFromMs(this.updatedMs),
      lastSeq: BigInt(this.seq),
      messageCount: this.messages.length,
      running: this.running,
    });
  }

  get lastSeq(): number {
    return this.seq;
  }

  /** Stops the running run (if any) and closes the log. */
  async close(): Promise<void> {
    this.closing = true;
    clearTimeout(this.collectTimer);
    this.run?.controller.abort(new Error("runner shutting down"));
    await this.run?.done;
    this.flushDelta();
    await this.log.append({ t: "closed", seq: this.seq }, true).catch(() => undefined);
    await this.log.close();
  }
}
