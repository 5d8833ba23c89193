// The session lifecycle's table (services/runner/session/lifecycle.ts): where each happening
// leaves each phase, what cannot happen, and how a phase reads as SessionInfo's state. The actor
// following it through real runs is covered by every in-process test: the harness fails a file
// in which an actor met a happening its phase does not expect (test/helpers/in-process.ts).
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  type Happening,
  type Phase,
  PHASES,
  idleIn,
  nextPhase,
  sessionStateOf,
} from "../../services/runner/session/lifecycle.js";
import { SessionState } from "../../services/shared/gen/troupe/v1/session_pb.js";

const ALL: Happening[] = [
  "runStarted",
  "runEnded",
  "runStoppedToWait",
  "runThrew",
  "waitAnswered",
  "waitClosed",
  "rebuiltIdle",
  "rebuiltWaiting",
  "rebuiltCutOff",
  "gaveUp",
  "close",
  "handOver",
  "lose",
];

/** Follows `happenings` from `from`; throws at the first one the table does not expect. */
function walk(from: Phase, ...happenings: Happening[]): Phase {
  let phase = from;
  for (const h of happenings) {
    const to = nextPhase(phase, h);
    if (!to) throw new Error(`${h} in ${phase}`);
    phase = to;
  }
  return phase;
}

describe("the session lifecycle", () => {
  test("a prompt's run: idle, running, idle", () => {
    assert.equal(walk("idle", "runStarted"), "running");
    assert.equal(walk("idle", "runStarted", "runEnded"), "idle");
  });

  test("a run that waits: it stops, the answer owes its resume, the resume runs to its end", () => {
    assert.equal(walk("idle", "runStarted", "runStoppedToWait"), "waiting");
    assert.equal(walk("waiting", "waitAnswered"), "resuming");
    assert.equal(walk("waiting", "waitAnswered", "runStarted", "runEnded"), "idle");
    // An abort or a deadline's policy ends it without going on.
    assert.equal(walk("waiting", "waitClosed"), "idle");
  });

  test("nothing starts beside a run that waits, and a wait is answered only while waiting", () => {
    assert.equal(nextPhase("waiting", "runStarted"), undefined);
    for (const phase of ["idle", "running", "resuming", "restarting", "failed"] as Phase[]) {
      assert.equal(nextPhase(phase, "waitAnswered"), undefined, phase);
      assert.equal(nextPhase(phase, "waitClosed"), undefined, phase);
    }
  });

  test("a load lands where the log says: idle, waiting, or owing a cut-off run", () => {
    assert.equal(walk("idle", "rebuiltIdle"), "idle");
    assert.equal(walk("idle", "rebuiltWaiting"), "waiting");
    assert.equal(walk("idle", "rebuiltCutOff", "runStarted"), "running");
  });

  test("a run that throws: restarting, rebuilt from the log, and failed when supervision gives up", () => {
    assert.equal(walk("running", "runThrew"), "restarting");
    // The restart rebuilds inside the failed run, whose end comes after.
    assert.equal(walk("running", "runThrew", "rebuiltIdle", "runEnded"), "idle");
    assert.equal(walk("running", "runThrew", "rebuiltIdle", "gaveUp", "runEnded"), "failed");
    assert.equal(nextPhase("failed", "runStarted"), undefined);
    assert.equal(nextPhase("restarting", "runStarted"), undefined);
  });

  test("every phase closes, hands over or is lost; lost is the end", () => {
    for (const phase of PHASES) {
      assert.equal(nextPhase(phase, "lose"), "lost", phase);
      if (phase === "lost") continue;
      if (phase !== "handedOver") assert.equal(nextPhase(phase, "close"), "closed", phase);
      if (phase !== "closed") assert.equal(nextPhase(phase, "handOver"), "handedOver", phase);
    }
    for (const h of ALL) assert.equal(nextPhase("lost", h), "lost", h);
  });

  test("a closed actor starts nothing and is not answered", () => {
    for (const phase of ["closed", "handedOver"] as Phase[]) {
      for (const h of ["runStarted", "waitAnswered", "waitClosed"] as Happening[])
        assert.equal(nextPhase(phase, h), undefined, `${h} in ${phase}`);
      assert.equal(nextPhase(phase, "runEnded"), phase, "the stopped run still ends");
    }
  });

  test("SessionInfo's state and idleness read from the phase", () => {
    assert.equal(sessionStateOf("idle", true), SessionState.IDLE);
    assert.equal(sessionStateOf("idle", false), SessionState.RUNNING, "a queued prompt is a run to come");
    assert.equal(sessionStateOf("resuming", true), SessionState.RUNNING);
    assert.equal(sessionStateOf("restarting", true), SessionState.RUNNING);
    assert.equal(sessionStateOf("waiting", false), SessionState.WAITING);
    assert.equal(sessionStateOf("failed", true), SessionState.FAILED);
    assert.equal(idleIn("waiting", false, false), true, "a run that waits counts as none");
    assert.equal(idleIn("resuming", true, false), false, "a run owed is work");
    assert.equal(idleIn("lost", true, true), false, "a lost actor's stopped run is still ending");
    assert.equal(idleIn("lost", true, false), true);
  });
});
