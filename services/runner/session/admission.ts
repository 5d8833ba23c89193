// A client frame's way into its session, as decisions: a frame is refused before anything of it
// is recorded (a failed session, a decision nobody waits for, a full mailbox, a prompt in reject
// mode while a run goes), acknowledged again as a duplicate when it repeats one already taken
// (never acted on twice), or admitted, drawing on its tenant's quota of runs when it would start
// one. Admission keeps each frame's acknowledgement and counts frames whose log write is in
// flight; it calls nothing. The actor carries a frame through (actor-hosts.ts admitFrame): the
// log write (appends are serialised, so frames keep their arrival order), the frame's place in
// the mailbox, and its acknowledgement.
import { FRAME_KIND } from "../../shared/frames.js";
import { type RpcError, Status, failedPrecondition, statusName } from "../../shared/errors.js";
import type { ClientFrame } from "../../shared/gen/troupe/v1/session_pb.js";
import type { Mailbox } from "./mailbox.js";
import type { EventPayload } from "../loop/run.js";

/** Where the session stands, as a frame's screening reads it. */
export interface Standing {
  readonly sessionId: string;
  readonly mailbox: Mailbox;
  /** A run is going, owed or waiting: messages are placed as their queue mode says for a running run. */
  readonly running: boolean;
  /** The held calls' verdict on the frame (held-calls.ts check). */
  readonly check: RpcError | "duplicate" | undefined;
}

/** What becomes of a frame: refused (nothing recorded), a duplicate, or admitted. */
export type Screening = { refuse: RpcError } | "duplicate" | { admit: { startsRun: boolean } };

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

  /** Frames admitted and not yet placed: the session is not idle while any are. */
  get admitting(): number {
    return this.inFlight;
  }

  /** The acknowledgement of a frame id taken before (pending or given); a resend waits on it. */
  earlier(frameId: string): Promise<unknown> | undefined {
    return this.acks.get(frameId);
  }

  /** Keeps `ack` as the frame's acknowledgement; a refused frame's id is forgotten (it may come again). */
  track(frameId: string, ack: Promise<unknown>): void {
    this.acks.set(frameId, ack);
    ack.then(
      () => this.acks.get(frameId) === ack && this.acks.set(frameId, ACKNOWLEDGED),
      () => this.acks.delete(frameId),
    );
  }

  /** A failed session (`failed` says why) takes nothing but aborts. */
  failedRefusal(frame: ClientFrame, sessionId: string, failed: string | undefined): RpcError | undefined {
    if (!failed || frame.kind.case === "abort") return undefined;
    return failedPrecondition(`session ${sessionId} has failed: ${failed}`);
  }

  /** What becomes of a frame, given where its session stands. */
  screen(frame: ClientFrame, s: Standing): Screening {
    if (s.check === "duplicate") return "duplicate";
    if (s.check) return { refuse: s.check };
    const full = s.mailbox.refusal(frame, s.running, this.inFlight, s.sessionId);
    if (full) return { refuse: full };
    // A message that would start a run in an idle session waits for its tenant's quota of runs.
    const kind = frame.kind.case;
    return { admit: { startsRun: kind !== "abort" && kind !== "toolDecision" && !s.running && s.mailbox.empty } };
  }

  /** A frame's log write begins (an abort takes no room in the mailbox); call what it returns when it ends. */
  writing(frame: ClientFrame): () => void {
    if (frame.kind.case === "abort") return () => undefined;
    this.inFlight++;
    return () => void this.inFlight--;
  }

  /** Recovery: the log shows this frame acknowledged (or owed an acknowledgement, which `ack` sends). */
  restore(frameId: string, ack: () => unknown): void {
    if (this.acks.has(frameId)) return;
    ack();
    this.acks.set(frameId, ACKNOWLEDGED);
  }

  /** Forgets every acknowledgement (a restart reads them back from the log). */
  clear(): void {
    this.acks.clear();
  }
}

/** The acknowledgement of a frame taken again: it is marked duplicate and acts on nothing. */
export function duplicateAck(frame: ClientFrame): EventPayload {
  return {
    case: "frameAccepted",
    value: { frameId: frame.frameId, kind: FRAME_KIND[frame.kind.case!], duplicate: true },
  };
}

/** The event that tells every subscriber why a frame was refused (the caller gets the status too). */
export function refusalEvent(frame: ClientFrame, err: RpcError): EventPayload {
  return {
    case: "error",
    value: {
      code: statusName(err.code),
      message: err.message,
      retryable: err.code === Status.RESOURCE_EXHAUSTED,
      frameId: frame.frameId,
    },
  };
}
