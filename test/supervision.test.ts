// A run that fails unexpectedly (a bug, made to happen here with a failpoint) restarts its
// session from the log; too many failures mark the session failed; other sessions never notice.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Role, StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../services/shared/errors.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack({ env: { TROUPE_FAILPOINTS: "runner.run=boom" } });
});
after(async () => {
  await stack?.stop();
});

const ends = (s: ChatSession) =>
  s.events
    .filter((e) => e.payload.case === "agentEnd")
    .map((e) => (e.payload.case === "agentEnd" ? e.payload.value.stopReason : 0));

test("a failed run restarts the session from its log; what was queued still runs; the stream stays", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("sup-1");
  await s.waitOpened();
  s.prompt("boom once");
  const after1 = s.prompt("then this");
  await s.until(() => ends(s).length >= 2, 20_000);
  s.close();
  assert.deepEqual(ends(s), [StopReason.ERROR, StopReason.COMPLETED]);
  assert.ok(
    s.events.some(
      (e) =>
        e.payload.case === "error" &&
        e.payload.value.code === "INTERNAL" &&
        /restarts from its log/.test(e.payload.value.message),
    ),
  );
  const seqs = s.events.map((e) => Number(e.seq));
  assert.deepEqual(
    seqs,
    seqs.map((_, i) => seqs[0] + i),
    "seq stays gapless across the restart",
  );
  const history = await stack.gateway.getHistory({ sessionId: "sup-1" });
  // The message that triggered the failure is kept once and not run again; the next one runs.
  assert.deepEqual(
    history.messages.map((m) => [Role[m.role], m.text]),
    [
      ["USER", "boom once"],
      ["USER", "then this"],
      ["ASSISTANT", "You said: then this"],
    ],
  );
  assert.equal(history.messages[1].frameId, after1);
});

test("a prompt sent while the session restarts waits for it and then runs", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("sup-4");
  await s.waitOpened();
  s.prompt("boom here");
  await s.waitFor((e) => e.payload.case === "error" && /restarts from its log/.test(e.payload.value.message));
  const during = s.send({ case: "prompt", value: { text: "sent during the restart" } });
  await s.until(() => ends(s).length >= 2, 20_000);
  s.close();
  assert.deepEqual(ends(s), [StopReason.ERROR, StopReason.COMPLETED]);
  const history = await stack.gateway.getHistory({ sessionId: "sup-4" });
  assert.deepEqual(
    history.messages.map((m) => m.frameId || Role[m.role]),
    [history.messages[0].frameId, during, "ASSISTANT"],
  );
});

test("five failures within a minute mark the session failed; another session is untouched", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("sup-2");
  await s.waitOpened();
  const other = new ChatSession(stack.gateway);
  other.open("sup-3");
  await other.waitOpened();
  for (let i = 1; i <= 5; i++) {
    s.prompt(`boom ${i}`);
    await s.until(() => ends(s).length >= i, 20_000);
    other.prompt(`fine ${i}`);
    await other.until(() => ends(other).length >= i, 10_000);
  }
  await s.waitFor((e) => e.payload.case === "error" && e.payload.value.code === "SESSION_FAILED");
  const refusedId = s.prompt("anything");
  const refused = await s.waitFor((e) => e.payload.case === "error" && e.payload.value.frameId === refusedId);
  assert.ok(refused.payload.case === "error" && refused.payload.value.code === "FAILED_PRECONDITION");
  await assert.rejects(stack.gateway.sendMessage({ sessionId: "sup-2", frameId: "u1", text: "hello?" }), {
    code: Status.FAILED_PRECONDITION,
  });
  s.close();
  other.close();
  assert.deepEqual(ends(other), Array(5).fill(StopReason.COMPLETED), "the other session never noticed");
});
