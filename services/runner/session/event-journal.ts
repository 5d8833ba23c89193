// A session's events as its clients see them: numbered (seq rises by exactly one per event, and
// blocks of seqs are reserved in the log before any of them is handed out), recorded (complete
// events go to the log; token deltas do not), kept in a ring for clients that resume, and sent to
// every subscriber. Token deltas that arrive in one burst become one event.
//
// An event whose record is synced (a run's end, a compaction's end) reaches no client before the
// store has it, and events after it wait behind it: a client that saw a turn end finds that turn
// in the history, whatever becomes of this runner next. Everything before it streams at once.
//
// The journal is given its session's log and its subscribers, and calls nothing of the session:
// the actor numbers an event, looks at it (the held calls' fold), then publishes it.
import { create, fromJson, type JsonValue, toJson } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { RpcError } from "../../shared/errors.js";
import { type AgentEvent, AgentEventSchema } from "../../shared/gen/troupe/v1/session_pb.js";
import type { EventPayload } from "../loop/run.js";
import { RecentEvents } from "./recent-events.js";
import type { LogRecord } from "./session-log.js";

/** Where events go: a client's stream (or anything that takes them in order). */
export interface EventSubscriber {
  send(event: AgentEvent): void;
  /** Pending while the subscriber's stream is full. */
  pressure(): Promise<void> | undefined;
  /** The actor can serve it no more (the session moved to another runner): end with `err`. */
  close(err: RpcError): void;
}

/** Where the journal's records go, and come back from: the session's log (session-writes.ts). */
export interface JournalLog {
  /**
   * Appends; with `sync`, settles once the record is durable (or its write failed). Contract:
   * never throws or rejects; a failed write is the log's to handle.
   */
  append(record: LogRecord, sync: boolean): Promise<void>;
  /** The session's records, for a replay that reaches past the ring. May reject. */
  read(): Promise<LogRecord[]>;
}

/** Recent events (deltas included) kept in memory for resuming clients. */
export const RING_SIZE = 4096;
/**
 * What the ring keeps once the session is idle. Everything but token deltas is in the log, so a
 * client resuming from further back loses only deltas (reported as a gap); thousands of idle
 * sessions must not each hold a full ring.
 */
const IDLE_RING_SIZE = 64;
/**
 * seq values are reserved in the log in blocks of this many, so a restart never hands out a seq a
 * client may already hold (it resumes past the last reservation).
 */
export const SEQ_BLOCK = 1024;
/** A coalesced delta event carries at most this much text. */
const MAX_DELTA_CHARS = 16 * 1024;
/** Payloads too fine-grained to log: the complete message follows them. */
const TRANSIENT: ReadonlySet<EventPayload["case"]> = new Set(["messageUpdate", "toolExecutionUpdate"]);

/**
 * Journals holding a delta, flushed together after this turn of the event loop. One immediate for
 * all of them: at a real model's pace each token comes in a read of its own, and an immediate per
 * token per session cost the runner more than the event it delayed (bench/stream, paced).
 */
const deltasWaiting = new Set<EventJournal>();
const flushWaitingDeltas = (): void => {
  const journals = [...deltasWaiting];
  deltasWaiting.clear();
  for (const journal of journals) journal.flushDelta();
};

export class EventJournal {
  private seq = 0;
  private reservedUpTo = 0;
  private readonly ring = new RecentEvents(RING_SIZE);
  private readonly subscribers = new Set<EventSubscriber>();
  private pendingDelta?: { messageId: string; kind: "text" | "thinking"; text: string; turnId: string };
  /** Published events held back until the synced record at their head is durable. */
  private readonly outbox: { event: AgentEvent; durable?: Promise<void> }[] = [];
  private releasing = false;
  private releasedWaiters: (() => void)[] = [];
  /** The seq at which the session went idle: the ring is packed once all up to it is released. */
  private idleAt = -1;
  /** When the last event was published (0: none yet). */
  lastPublishedMs = 0;

  constructor(
    private readonly sessionId: string,
    private readonly log: JournalLog,
  ) {}

  get lastSeq(): number {
    return this.seq;
  }

  get subscriberCount(): number {
    return this.subscribers.size;
  }

  /** Numbering goes on from `seq`, under a reservation up to `reservedUpTo` already in the log. */
  resumeAt(seq: number, reservedUpTo: number): void {
    this.seq = seq;
    this.reservedUpTo = reservedUpTo;
  }

  /** An event the log holds was numbered `seq`: numbering goes on past it. */
  saw(seq: number): void {
    this.seq = Math.max(this.seq, seq);
  }

  /** Numbers and publishes an event of run `turnId` ("" between runs). */
  emit(payload: EventPayload, turnId: string): AgentEvent {
    const event = this.number(payload, turnId);
    this.publish(event);
    return event;
  }

  /**
   * Numbers an event of run `turnId` (after any delta waiting to go out, which is published
   * first). Whoever numbers it publishes it next, having looked at it before any subscriber can.
   */
  number(payload: EventPayload, turnId: string): AgentEvent {
    this.flushDelta();
    // create() turns the payload's init object into a message.
    const event = create(AgentEventSchema, {
      sessionId: this.sessionId,
      seq: BigInt(++this.seq),
      turnId,
      time: timestampFromMs(Date.now()),
      payload: payload as never,
    });
    // Reserved half a block ahead: this event's seq is already covered, so it need not wait.
    if (this.seq >= this.reservedUpTo - SEQ_BLOCK / 2) {
      this.reservedUpTo = this.seq + SEQ_BLOCK;
      void this.log.append({ t: "seq", upTo: this.reservedUpTo }, true);
    }
    return event;
  }

  /** Streamed text or thinking of run `turnId`; deltas of one burst become one event. */
  delta(messageId: string, kind: "text" | "thinking", text: string, turnId: string): void {
    const p = this.pendingDelta;
    if (p && p.messageId === messageId && p.kind === kind && p.text.length + text.length <= MAX_DELTA_CHARS) {
      p.text += text;
      return;
    }
    this.flushDelta();
    this.pendingDelta = { messageId, kind, text, turnId };
    if (deltasWaiting.size === 0) setImmediate(flushWaitingDeltas);
    deltasWaiting.add(this);
  }

  flushDelta(): void {
    const p = this.pendingDelta;
    if (!p) return;
    this.pendingDelta = undefined;
    const delta = { case: p.kind, value: p.text };
    this.emit({ case: "messageUpdate", value: { messageId: p.messageId, delta } }, p.turnId);
  }

  /**
   * Records a numbered event (complete events go to the log; a run's or a compaction's end is
   * synced) and hands it to the subscribers, in order: behind a synced record until it is durable.
   */
  publish(event: AgentEvent): void {
    const kind = event.payload.case;
    let durable: Promise<void> | undefined;
    if (!TRANSIENT.has(kind)) {
      const sync = kind === "agentEnd" || kind === "compactionEnd";
      const written = this.log.append({ t: "event", event: toJson(AgentEventSchema, event) }, sync);
      if (sync) durable = written;
    }
    this.lastPublishedMs = Date.now();
    if (!durable && this.outbox.length === 0) this.release(event);
    else {
      this.outbox.push({ event, durable });
      if (!this.releasing) void this.releaseOutbox();
    }
  }

  /** Hands held events out in order, each once the synced record ahead of it is durable. */
  private async releaseOutbox(): Promise<void> {
    this.releasing = true;
    while (this.outbox.length > 0) {
      const next = this.outbox[0];
      if (next.durable) await next.durable;
      this.outbox.shift();
      this.release(next.event);
    }
    this.releasing = false;
    for (const wake of this.releasedWaiters.splice(0)) wake();
    this.packIfIdle();
  }

  /** Resolves once every event published so far has been handed to the subscribers. */
  delivered(): Promise<void> {
    return this.outbox.length === 0 ? Promise.resolve() : new Promise((resolve) => this.releasedWaiters.push(resolve));
  }

  private release(event: AgentEvent): void {
    this.ring.push(event);
    for (const sub of this.subscribers) sub.send(event);
  }

  /** Resolves when every subscriber can take more events (backpressure). */
  pressure(): Promise<void> | undefined {
    let waits: Promise<void>[] | undefined;
    for (const sub of this.subscribers) {
      const p = sub.pressure();
      if (p) (waits ??= []).push(p);
    }
    return waits && Promise.all(waits).then(() => undefined);
  }

  /**
   * The session went idle: the ring keeps only its last few events, packed, once the events
   * still held for durability (its agent_end) are out; an event published meanwhile cancels it.
   */
  trimIdle(): void {
    this.idleAt = this.seq;
    this.packIfIdle();
  }

  private packIfIdle(): void {
    if (this.idleAt !== this.seq || this.outbox.length > 0) return;
    this.idleAt = -1;
    this.ring.pack(IDLE_RING_SIZE);
  }

  /**
   * Adds a subscriber. With afterSeq, first sends what the session still holds after that seq:
   * from memory when the ring covers it, else the complete events from the log. Live events that
   * happen meanwhile are held back and follow in order, each exactly once.
   */
  async attach(sub: EventSubscriber, afterSeq?: number): Promise<void> {
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
      const oldest = this.ring.oldest();
      const floor = oldest ? Number(oldest.seq) : this.seq + 1;
      if (afterSeq + 1 < floor) {
        for (const rec of await this.log.read()) {
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
    this.subscribers.add(sub);
  }

  detach(sub: EventSubscriber): void {
    this.subscribers.delete(sub);
  }

  /** Ends every subscriber's stream with `err`. */
  closeAll(err: RpcError): void {
    for (const sub of this.subscribers) sub.close(err);
    this.subscribers.clear();
  }
}
