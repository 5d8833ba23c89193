// A run its runner was killed in, or stopped past its drain grace, goes on when the runner comes
// back, with no client asking: the turn's message was sent with SendMessage and nobody watches
// the session (a schedule's turn, a client that went away). The session's log, read from disk
// without loading the session, shows the run resumed and ended with the whole answer. (On
// PostgreSQL, with another runner taking over from a killed one: test/cluster.test.ts.)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { StopReason, type AgentEvent } from "../services/shared/gen/troupe/v1/session_pb.js";
import { JsonlSessionStore } from "../services/runner/store/jsonl-session-store.js";
import { settledLog } from "../services/runner/session/session-log.js";
import { refOf } from "../services/shared/session-ref.js";
import { loggedEvents as eventsOf, runOutcome, tokensReply } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  // A short drain grace: a SIGTERM hands over a run that is still going rather than waiting for it.
  stack = await startStack({
    env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0", TROUPE_DRAIN_GRACE_MS: "300" },
  });
});
after(() => stack?.stop());

/** The session's events as its log on disk has them (no lease taken, nothing loaded). */
async function loggedEvents(sessionId: string): Promise<AgentEvent[]> {
  return eventsOf(
    await new JsonlSessionStore(stack.dataDir).read(refOf({ tenant: "local", principal: "dev" }, sessionId)),
  );
}

/**
 * Starts a `tokens`-token turn (20 a second) in a new session nobody watches, stops the runner
 * with `signal` half a second in, checks the run was cut, restarts the runner and returns the
 * session's logged events once the run has ended there.
 */
async function cutAndResume(sessionId: string, tokens: number, signal: NodeJS.Signals): Promise<AgentEvent[]> {
  await stack.gateway.createSession({ sessionId });
  await stack.gateway.sendMessage({ sessionId, frameId: "m1", text: `!tokens ${tokens} rate=20` });
  await waitFor("the run to start", async () =>
    (await loggedEvents(sessionId)).some((e) => e.payload.case === "agentStart"),
  );
  await new Promise((r) => setTimeout(r, 500));
  await stack.kill("runner", signal);
  const cut = await loggedEvents(sessionId);
  assert.ok(!cut.some((e) => e.payload.case === "agentEnd"), `the ${signal} cut the run`);

  await stack.start("runner");
  return waitFor(
    "the resumed run to end",
    async () => {
      const evs = await loggedEvents(sessionId);
      return evs.some((e) => e.payload.case === "agentEnd") && evs;
    },
    20_000,
  );
}

test("a runner killed mid-run resumes the run at its restart, with no client attached", async () => {
  const events = await cutAndResume("left-1", 40, "SIGKILL");
  assert.deepEqual(runOutcome(events), { resumed: true, stopReason: StopReason.COMPLETED, answers: [tokensReply(40)] });
  assert.match(stack.logs(), /loaded sessions whose runner process is gone/);
});

test("a session left with nothing owed is not loaded at the restart; it is taken when next asked for", async () => {
  // left-1 ended above and is held by the restarted runner; left-idle's turn ends before the kill.
  await stack.gateway.createSession({ sessionId: "left-idle" });
  await stack.gateway.sendMessage({ sessionId: "left-idle", frameId: "m1", text: "hello" });
  const store = new JsonlSessionStore(stack.dataDir);
  const ref = (id: string) => refOf({ tenant: "local", principal: "dev" }, id);
  for (const id of ["left-1", "left-idle"])
    await waitFor(`${id}'s log to say nothing is owed`, async () => settledLog(await store.read(ref(id))));
  const before = stack.logs().length;
  await stack.kill("runner", "SIGKILL");
  await stack.start("runner");
  // Both were held when the runner was killed, and neither owed anything: the sweep loads neither.
  await waitFor("the restarted runner to serve", async () => /runner \S+ serving/.test(stack.logs().slice(before)));
  await new Promise((r) => setTimeout(r, 1000));
  assert.doesNotMatch(stack.logs().slice(before), /loaded sessions whose runner process is gone/);
  // Asked for, it is taken over from the dead process and goes on; nothing in it ran again.
  await stack.gateway.sendMessage({ sessionId: "left-idle", frameId: "m2", text: "again" });
  const events = await waitFor("the second turn", async () => {
    const evs = await loggedEvents("left-idle");
    return evs.filter((e) => e.payload.case === "agentEnd").length === 2 && evs;
  });
  assert.equal(events.filter((e) => e.payload.case === "agentStart").length, 2);
  assert.ok(!events.some((e) => e.payload.case === "runResumed"));
});

test("a run handed over at a SIGTERM resumes at the restart, with no client attached", async () => {
  // Before stop 62 a run handed over at a shutdown released its session, so no sweep found it:
  // it went on only when someone next used the session. 4 s of tokens: the drain (300 ms of
  // grace, then at most 1 s for calls) ends well inside the turn.
  const events = await cutAndResume("left-term", 80, "SIGTERM");
  assert.deepEqual(runOutcome(events), { resumed: true, stopReason: StopReason.COMPLETED, answers: [tokensReply(80)] });
});

test("a session idle at a SIGTERM is let go, not adopted at the restart", async () => {
  await stack.gateway.createSession({ sessionId: "idle-term" });
  await stack.gateway.sendMessage({ sessionId: "idle-term", frameId: "m1", text: "hello" });
  await waitFor("the turn", async () => (await loggedEvents("idle-term")).some((e) => e.payload.case === "agentEnd"));
  const before = stack.logs().length;
  await stack.kill("runner", "SIGTERM");
  await stack.start("runner");
  // The restarted runner registered and swept: nothing of a clean shutdown is an orphan.
  await waitFor("the restarted runner to serve", async () => /runner \S+ serving/.test(stack.logs().slice(before)));
  await new Promise((r) => setTimeout(r, 1000));
  assert.doesNotMatch(stack.logs().slice(before), /loaded sessions whose runner process is gone/);
});
