// A session's lifecycle: where its actor stands, and what moves it, in one table read top to
// bottom. The actor reports what happened (a run started, a run stopped to wait, the log was read
// again); `nextPhase` decides where that leaves the session; the actor acts on the phase it is in.
// Plain data: nothing here calls anything. What each phase holds (the run's abort controller, the
// held calls, the resume owed) stays with the part that owns it.
import { SessionState } from "../../shared/gen/troupe/v1/session_pb.js";

/** Where a session stands. */
export type Phase =
  /** Nothing running and nothing owed; queued prompts (collect mode's gathering) start a run. */
  | "idle"
  /** A cut-off or waiting run is owed: it starts as soon as the turn lock lets it, before anything queued. */
  | "resuming"
  /** A run is going (the turn lock is held). */
  | "running"
  /**
   * The open run stopped for the outside (a person's decision, a client's tool result): nothing
   * runs beside it; it is in the log, so it survives a restart and a hand-over.
   */
  | "waiting"
  /** A run threw (a bug): the actor is rebuilding itself from its log; frames wait. */
  | "restarting"
  /** Too many restarts: frames are refused; the session serves reads until it leaves memory. */
  | "failed"
  /** Closing or closed here (shutdown, passivation): a run going is stopped and its end recorded. */
  | "closed"
  /** Closed with its run left to the next runner: nothing more of the run is recorded here. */
  | "handedOver"
  /** Another runner took the session or its log failed: everything is refused. */
  | "lost";

/** What the actor reports. */
export type Happening =
  /** The turn lock started a run (queued prompts, or the resume owed). */
  | "runStarted"
  /** The run ended and did not stop to wait. */
  | "runEnded"
  /** The run ended having stopped to wait (RunWaiting). */
  | "runStoppedToWait"
  /** The run threw: supervision rebuilds the actor. */
  | "runThrew"
  /** Every held call was answered, or steering came: the waiting run goes on. */
  | "waitAnswered"
  /** The waiting run was ended without going on (an abort, a deadline's policy). */
  | "waitClosed"
  /** The log was read again (a load or a restart), and it shows: nothing open, */
  | "rebuiltIdle"
  /** ... a run that waits, */
  | "rebuiltWaiting"
  /** ... a run cut off, to resume. */
  | "rebuiltCutOff"
  /** Supervision gave up on the session. */
  | "gaveUp"
  /** The actor closes (shutdown, passivation, hand-over with nothing open). */
  | "close"
  /** The actor closes with a run going or waiting, to be resumed by the next runner. */
  | "handOver"
  /** The session cannot go on here. */
  | "lose";

type Row = { readonly [H in Happening]?: Phase | "stay" };

const CLOSING: Row = { close: "closed", handOver: "handedOver", lose: "lost" };
const AFTER_CLOSE: Row = {
  runEnded: "stay",
  runStoppedToWait: "stay",
  runThrew: "stay",
  rebuiltIdle: "stay",
  rebuiltWaiting: "stay",
  rebuiltCutOff: "stay",
  gaveUp: "stay",
};

/**
 * Every phase and the happenings it meets. `"stay"`: met and leaves the phase as it is (why is
 * said beside it). A happening missing from a phase's row is a bug in the actor.
 */
const MOVES: { readonly [P in Phase]: Row } = {
  idle: {
    runStarted: "running",
    rebuiltIdle: "idle",
    rebuiltWaiting: "waiting",
    rebuiltCutOff: "resuming",
    // A restarted run's end arrives after the rebuild it caused.
    runEnded: "stay",
    gaveUp: "failed",
    ...CLOSING,
  },
  resuming: { runStarted: "running", runEnded: "stay", gaveUp: "failed", ...CLOSING },
  running: {
    runEnded: "idle",
    runStoppedToWait: "waiting",
    runThrew: "restarting",
    ...CLOSING,
  },
  waiting: { waitAnswered: "resuming", waitClosed: "idle", runEnded: "stay", gaveUp: "failed", ...CLOSING },
  restarting: { rebuiltIdle: "idle", rebuiltWaiting: "waiting", rebuiltCutOff: "resuming", ...CLOSING },
  // The failed run's own end comes after supervision gave up.
  failed: { runEnded: "stay", ...CLOSING },
  // A run stopped by the close still ends (a restart under way finishes its rebuild, and nothing
  // starts); a close with an error then loses the session.
  closed: { ...AFTER_CLOSE, close: "stay", lose: "lost" },
  handedOver: { ...AFTER_CLOSE, handOver: "stay", lose: "lost" },
  // Lost is the end: whatever still happens in the actor changes nothing.
  lost: {
    runStarted: "stay",
    runEnded: "stay",
    runStoppedToWait: "stay",
    runThrew: "stay",
    waitAnswered: "stay",
    waitClosed: "stay",
    rebuiltIdle: "stay",
    rebuiltWaiting: "stay",
    rebuiltCutOff: "stay",
    gaveUp: "stay",
    close: "stay",
    handOver: "stay",
    lose: "stay",
  },
};

/** What the actor logs (at error) when a happening is missing from its phase's row. */
export const UNEXPECTED = "a session met a happening its phase does not expect";

/** Where `happening` leaves a session in `phase`; undefined: it cannot happen there (a bug). */
export function nextPhase(phase: Phase, happening: Happening): Phase | undefined {
  const to = MOVES[phase][happening];
  return to === "stay" ? phase : to;
}

/** Every phase, for tests and docs. */
export const PHASES = Object.keys(MOVES) as Phase[];

/** A run is going in these phases (the turn lock is held, or a restart holds it). */
export function runGoing(phase: Phase): boolean {
  return phase === "running" || phase === "restarting";
}

/** A run is going, owed or waiting: a message arriving now meets a run, and its queue mode places it. */
export function runOn(phase: Phase): boolean {
  return runGoing(phase) || phase === "resuming" || phase === "waiting";
}

/** At rest: no run going, owed or waiting (idle, or failed, where none starts again). */
export function atRest(phase: Phase): boolean {
  return phase === "idle" || phase === "failed";
}

/** Closed here, one way or another: nothing starts again in this actor. */
export function ended(phase: Phase): boolean {
  return phase === "closed" || phase === "handedOver" || phase === "lost";
}

/** The phase as SessionInfo says it; `queueEmpty`: no prompt waits (a queued one is a run to come). */
export function sessionStateOf(phase: Phase, queueEmpty: boolean): SessionState {
  if (phase === "failed") return SessionState.FAILED;
  if (phase === "waiting") return SessionState.WAITING;
  if (phase === "idle" || ended(phase)) return queueEmpty ? SessionState.IDLE : SessionState.RUNNING;
  return SessionState.RUNNING;
}

/**
 * Nothing will happen without something from outside: no run going or owed, nothing queued (a
 * run that waits counts as none). `lockHeld`: a closed or lost actor's stopped run is still ending.
 */
export function idleIn(phase: Phase, queueEmpty: boolean, lockHeld: boolean): boolean {
  if (phase === "idle") return queueEmpty;
  return phase === "waiting" || phase === "failed" || (ended(phase) && !lockHeld);
}
