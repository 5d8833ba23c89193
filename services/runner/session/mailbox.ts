// A session's waiting messages, and where each one goes by its kind and queue mode (the table in
// docs/architecture.md): runs waiting to start, steering for the running run, follow-ups that
// join it after its last step, and prompts gathering for a collected run. Plain data: the mailbox
// places and hands out, and calls nothing; the actor decides when runs start and keeps the timer
// of a collection's quiet window.
import type { Context } from "@opentelemetry/api";
import { contextFromRecord } from "../../shared/process/telemetry.js";
import { FRAME_KIND } from "../../shared/frames.js";
import { type ClientFrame, QueueMode } from "../../shared/gen/troupe/v1/session_pb.js";
import { RpcError, type Status, failedPrecondition, resourceExhausted } from "../../shared/errors.js";
import type { QueuedMessage } from "../loop/run.js";
import { clientToolSpecs } from "../tools/client-tools.js";

/** Messages a session holds waiting (queued, steering, follow-ups, collecting) before it refuses more. */
export const MAILBOX_LIMIT = 100;
/** Prompts in collect mode that arrive within this quiet window of each other run together. */
export const COLLECT_WINDOW_MS = 500;

/** A message in the mailbox: its arrival order breaks ties when late steering is requeued. */
export interface Queued extends QueuedMessage {
  arrival: number;
}

/** A frame the session did not take; nothing of it was recorded. It keeps the refusal's trailers (a retry hint). */
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

/** Where a placed message went (Mailbox.place). */
export interface Placed {
  /** Its queue position, as the acknowledgement reports it. */
  position: number;
  /** The running run must be interrupted for it (queue mode interrupt). */
  interrupt: boolean;
  /** It joined a collection: its quiet window starts again. */
  collecting?: boolean;
}

export class Mailbox {
  /** Runs waiting to start, in order; each is one message or a collected group. */
  readonly queue: Queued[][] = [];
  readonly steering: Queued[] = [];
  readonly followUps: Queued[] = [];
  private collecting: Queued[] = [];
  private arrivals = 0;
  /** The session's default queue mode (a prompt may name its own). */
  mode = QueueMode.STEER;

  /** The message a frame carries (prompt, steer, follow-up), numbered in arrival order; undefined for others. */
  toQueued(frame: ClientFrame, traceContext: Context): Queued | undefined {
    const k = frame.kind;
    if (k.case !== "prompt" && k.case !== "steer" && k.case !== "followUp") return undefined;
    const ctx = Object.keys(frame.traceContext).length > 0 ? contextFromRecord(frame.traceContext) : traceContext;
    const instruction = k.case === "prompt" && k.value.instruction !== "" ? k.value.instruction : undefined;
    return {
      frameId: frame.frameId,
      kind: FRAME_KIND[k.case],
      text: k.value.text,
      instruction,
      ...(k.case === "prompt" && k.value.images.length > 0 ? { images: k.value.images } : {}),
      ...(k.case === "prompt" && k.value.sampling ? { sampling: k.value.sampling } : {}),
      ...(k.case === "prompt" && k.value.attachments.length > 0 ? { attachments: k.value.attachments } : {}),
      ...(k.case === "prompt" && k.value.clientTools.length > 0
        ? { clientTools: clientToolSpecs(k.value.clientTools) }
        : {}),
      ...(frame.speaker?.id ? { speaker: { id: frame.speaker.id, displayName: frame.speaker.displayName } } : {}),
      traceContext: ctx,
      arrival: ++this.arrivals,
    };
  }

  modeOf(mode: QueueMode): QueueMode {
    return mode === QueueMode.UNSPECIFIED ? this.mode : mode;
  }

  /** How many messages wait, of every kind. */
  waiting(): number {
    let n = this.steering.length + this.followUps.length + this.collecting.length;
    for (const group of this.queue) n += group.length;
    return n;
  }

  /**
   * Why the mailbox will not take this frame, or undefined: it is full (counting `inFlight` frames
   * admitted but not yet placed), or a run is going and the prompt's queue mode is reject.
   */
  refusal(frame: ClientFrame, running: boolean, inFlight: number, sessionId: string): RpcError | undefined {
    const kind = frame.kind;
    if (kind.case === "abort") return undefined;
    if (this.waiting() + inFlight >= MAILBOX_LIMIT) {
      return resourceExhausted(
        `session ${sessionId} has ${MAILBOX_LIMIT} messages waiting; retry when its runs have caught up`,
      );
    }
    if (kind.case === "prompt" && running && this.modeOf(kind.value.queueMode) === QueueMode.REJECT)
      return failedPrecondition(`a run is going in session ${sessionId} and this prompt's queue mode is reject`);
    return undefined;
  }

  /** Messages waiting: queued runs, steering, follow-ups and a collection in its quiet window. */
  get depth(): number {
    return (
      this.queue.reduce((n, run) => n + run.length, 0) +
      this.steering.length +
      this.followUps.length +
      this.collecting.length
    );
  }

  /** Nothing waits to run (steering and follow-ups belong to a run already going). */
  get empty(): boolean {
    return this.queue.length === 0 && this.collecting.length === 0;
  }

  /**
   * Places an admitted message. `running`: a run is going. Returns its queue position as the
   * acknowledgement reports it, whether the running run must be interrupted for it, and whether
   * it (re)opened a collection, whose quiet window (COLLECT_WINDOW_MS) the actor then times.
   */
  place(q: Queued, frame: ClientFrame, running: boolean): Placed {
    const kind = frame.kind;
    if (!running) {
      this.queue.push([q]);
      return { position: this.queue.length - 1, interrupt: false };
    }
    if (kind.case === "steer") {
      this.steering.push(q);
      return { position: 0, interrupt: false };
    }
    if (kind.case === "followUp") {
      // A follow-up joins the running run after its last step, unless runs already wait ahead of it.
      if (this.empty) this.followUps.push(q);
      else this.queue.push([q]);
      return { position: this.queue.length + 1, interrupt: false };
    }
    if (kind.case !== "prompt") return { position: 0, interrupt: false };
    switch (this.modeOf(kind.value.queueMode)) {
      case QueueMode.FOLLOWUP:
        this.queue.push([q]);
        return { position: this.queue.length, interrupt: false };
      case QueueMode.COLLECT:
        this.collecting.push(q);
        return { position: this.queue.length + 1, interrupt: false, collecting: true };
      case QueueMode.INTERRUPT:
        this.queue.unshift([q]);
        return { position: 0, interrupt: true };
      default:
        this.steering.push(q);
        return { position: 0, interrupt: false };
    }
  }

  /** The quiet window passed: the gathered prompts become one run. False: nothing was gathering. */
  closeCollection(): boolean {
    if (this.collecting.length === 0) return false;
    this.queue.push(this.collecting);
    this.collecting = [];
    return true;
  }

  /** Steering and follow-ups that came too late for the run that ended: they run next, in arrival order. */
  requeueLate(): void {
    const late = [...this.steering.splice(0), ...this.followUps.splice(0)].sort((a, b) => a.arrival - b.arrival);
    if (late.length > 0) this.queue.unshift(late);
  }

  /** Empties the mailbox; returns what it held, in arrival order. */
  clear(): Queued[] {
    const all = [
      ...this.steering.splice(0),
      ...this.followUps.splice(0),
      ...this.queue.splice(0).flat(),
      ...this.collecting.splice(0),
    ];
    return all.sort((a, b) => a.arrival - b.arrival);
  }
}
