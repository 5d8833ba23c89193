// A client frame's way into its session: refusals first (a refused frame leaves nothing in the
// log but the error event), then the log write (appends are serialised, so frames keep their
// arrival order), then its place in the mailbox and its acknowledgement. A resent frame_id is
// acknowledged again, marked duplicate, without acting twice.
import type { Context } from "@opentelemetry/api";
import { FRAME_KIND } from "../../shared/frames.js";
import { type RpcError, Status, failedPrecondition, statusName } from "../../shared/errors.js";
import type { AgentEvent, ClientFrame } from "../../shared/gen/troupe/v1/session_pb.js";
import { FrameRefused, type Mailbox, type Placed } from "./mailbox.js";
import type { EventPayload } from "../loop/run.js";

/** What admission needs from its session (the actor binds these in one literal). */
export interface AdmissionHost {
  readonly sessionId: string;
  readonly mailbox: Mailbox;
  /** The error every frame gets once the session is lost here. Contract: never throws. */
  lost(): RpcError | undefined;
  /** Why the session failed (it then takes nothing but aborts). Contract: never throws. */
  failed(): string | undefined;
  /** Pending while a restart rebuilds the session; admissions wait for it, in order. Contract: never throws. */
  restarting(): Promise<void> | undefined;
  /** Whether a run is going. Contract: never throws. */
  running(): boolean;
  /** Takes the tenant's quota for a run this frame will start. Contract: throws an RpcError when over it. */
  takeRun(): void;
  /** Writes the frame to the log. Contract: rejects with the error the client gets (the session is then lost). */
  record(frame: ClientFrame): Promise<void>;
  /** Publishes an event. Contract: never throws. */
  emit(payload: EventPayload): AgentEvent;
  /**
   * Why this frame cannot be taken (a decision on a call nobody waits on, say), "duplicate" when it
   * repeats what was already taken, or undefined. Contract: never throws.
   */
  check(frame: ClientFrame): RpcError | "duplicate" | undefined;
  /** Acts on a frame now in the mailbox (an abort, an interrupt, a collection, a run to start). Contract: never throws. */
  placed(frame: ClientFrame, placed: Placed): void;
}

/** What an acknowledged frame's entry becomes: its event is in the log and need not stay in memory. */
const ACKNOWLEDGED: Promise<unknown> = Promise.resolve();

export class Admission {
  /**
   * frame_id -> its acknowledgement while pending, then ACKNOWLEDGED, so a resent frame is
   * acknowledged without acting again. A session's every frame has an entry.
   */
  private readonly acks = new Map<string, Promise<unknown>>();
  /** Frames past their mailbox check whose log write is in flight (they count against its limit). */
  private inFlight = 0;

  constructor(private readonly host: AdmissionHost) {}

  /** Frames admitted and not yet placed: the session is not idle while any are. */
  get admitting(): number {
    return this.inFlight;
  }

  /** Admits one frame and resolves to its frame_accepted event once it is durable. */
  submit(frame: ClientFrame, traceContext: Context): Promise<AgentEvent> {
    const lost = this.host.lost();
    if (lost) return Promise.reject(lost);
    const failed = this.failedRefusal(frame);
    if (failed) return Promise.reject(failed);
    const earlier = this.acks.get(frame.frameId);
    if (earlier) {
      const kind = FRAME_KIND[frame.kind.case!];
      return earlier.then(() =>
        this.host.emit({ case: "frameAccepted", value: { frameId: frame.frameId, kind, duplicate: true } }),
      );
    }
    const ack = this.admit(frame, traceContext);
    this.acks.set(frame.frameId, ack);
    ack.then(
      () => this.acks.get(frame.frameId) === ack && this.acks.set(frame.frameId, ACKNOWLEDGED),
      () => this.acks.delete(frame.frameId),
    );
    return ack;
  }

  /** Recovery: the log shows this frame acknowledged (or owed an acknowledgement, which `ack` sends). */
  restore(frameId: string, ack: () => AgentEvent): void {
    if (this.acks.has(frameId)) return;
    ack();
    this.acks.set(frameId, ACKNOWLEDGED);
  }

  /** Forgets every acknowledgement (a restart reads them back from the log). */
  clear(): void {
    this.acks.clear();
  }

  private async admit(frame: ClientFrame, traceContext: Context): Promise<AgentEvent> {
    const host = this.host;
    while (host.restarting()) await host.restarting();
    const kind = frame.kind;
    const failed = this.failedRefusal(frame);
    if (failed) throw failed;
    const checked = host.check(frame);
    if (checked === "duplicate")
      return host.emit({
        case: "frameAccepted",
        value: { frameId: frame.frameId, kind: FRAME_KIND[kind.case!], duplicate: true },
      });
    if (checked) throw this.refuse(frame, checked);
    const full = host.mailbox.refusal(frame, host.running(), this.inFlight, host.sessionId);
    if (full) throw this.refuse(frame, full);
    // A message that would start a run in an idle session waits for its tenant's quota of runs.
    if (kind.case !== "abort" && kind.case !== "toolDecision" && !host.running() && host.mailbox.empty) {
      try {
        host.takeRun();
      } catch (err) {
        throw this.refuse(frame, err as RpcError);
      }
    }
    const counted = kind.case !== "abort";
    if (counted) this.inFlight++;
    try {
      // Not acknowledged when this fails, so the client resends; the session reloads from its log.
      await host.record(frame);
    } finally {
      if (counted) this.inFlight--;
    }
    const q = host.mailbox.toQueued(frame, traceContext);
    const placed: Placed = q ? host.mailbox.place(q, frame, host.running()) : { position: 0, interrupt: false };
    const ack = host.emit({
      case: "frameAccepted",
      value: { frameId: frame.frameId, kind: FRAME_KIND[kind.case!], queuePosition: placed.position },
    });
    host.placed(frame, placed);
    return ack;
  }

  private failedRefusal(frame: ClientFrame): FrameRefused | undefined {
    const why = this.host.failed();
    if (!why || frame.kind.case === "abort") return undefined;
    return this.refuse(frame, failedPrecondition(`session ${this.host.sessionId} has failed: ${why}`));
  }

  /** Tells every subscriber why a frame was refused (the caller gets the status too). */
  private refuse(frame: ClientFrame, err: RpcError): FrameRefused {
    this.host.emit({
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
}
