// Sessions with nothing to do leave memory and come back from their log, transparently; a replay
// that reaches past what memory held says where the token deltas were.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { QueueMode, Role, StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession, subscribeUntil } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack({ env: { TROUPE_PASSIVATE_AFTER_MS: "300", TROUPE_LOG_LEVEL: "debug" } });
});
after(async () => {
  await stack?.stop();
});

test("an idle session leaves memory, comes back from its log, and a replay reports the gap", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("passive-1");
  await s.waitOpened();
  s.prompt("!tokens 50 rate=500");
  await s.waitForPayload("agentEnd");
  s.close();
  const live = s.events;
  await waitFor(
    "the session to be passivated",
    async () => stack.logs().includes("passivated session passive-1"),
    10_000,
  );

  const replayed = await subscribeUntil(stack.gateway, "passive-1", 0n, 1);
  // Every seq is accounted for: each event, or a gap event covering first_seq..its own seq.
  let expected = 1;
  for (const e of replayed) {
    const seq = Number(e.seq);
    if (e.payload.case === "gap") {
      assert.equal(Number(e.payload.value.firstSeq), expected, "a gap starts right after the last event");
      assert.ok(seq >= expected);
    } else {
      assert.equal(seq, expected, `event ${e.payload.case}`);
    }
    expected = seq + 1;
  }
  assert.equal(expected - 1, Number(live.at(-1)!.seq), "the replay reaches the last event");
  assert.ok(
    replayed.some((e) => e.payload.case === "gap"),
    "token deltas are reported as a gap",
  );
  const full = replayed.filter((e) => e.payload.case === "messageEnd").at(-1)!;
  assert.ok(
    full.payload.case === "messageEnd" && full.payload.value.message!.text.endsWith("t50 "),
    "the complete message covers the gap",
  );
  const persisted = live.filter((e) => e.payload.case !== "messageUpdate").map((e) => Number(e.seq));
  assert.deepEqual(
    replayed.filter((e) => e.payload.case !== "gap").map((e) => Number(e.seq)),
    persisted,
  );

  // Back in use, transparently: history intact, seq continues.
  const again = new ChatSession(stack.gateway);
  again.open("passive-1", false);
  const opened = await again.waitOpened();
  assert.equal(Number(opened.lastSeq), Number(live.at(-1)!.seq));
  again.prompt("welcome back");
  const end = await again.waitForPayload("agentEnd");
  again.close();
  assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED);
  assert.equal(Number(again.events[0].seq), Number(live.at(-1)!.seq) + 1);
  const history = await stack.gateway.getHistory({ sessionId: "passive-1" });
  assert.deepEqual(
    history.messages.map((m) => Role[m.role]),
    ["USER", "ASSISTANT", "USER", "ASSISTANT"],
  );
});

test("messages dropped by an abort that cleared the queue stay dropped after a reload", async () => {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { sessionId: "passive-3", create: true, queueMode: QueueMode.FOLLOWUP } });
  await s.waitOpened();
  s.prompt("!tokens 2000 rate=500");
  await s.waitForPayload("messageUpdate");
  const dropped = [s.prompt("queued one"), s.prompt("queued two")];
  s.send({ case: "abort", value: { clearQueue: true } });
  await s.waitForPayload("agentEnd");
  await s.until(
    () => s.events.filter((e) => e.payload.case === "error" && e.payload.value.code === "CANCELLED").length === 2,
  );
  s.close();
  await waitFor("passivation", async () => stack.logs().includes("passivated session passive-3"), 10_000);
  const again = new ChatSession(stack.gateway);
  again.open("passive-3", false);
  await again.waitOpened();
  again.prompt("only this runs");
  await again.waitForPayload("agentEnd");
  await new Promise((r) => setTimeout(r, 300));
  again.close();
  assert.equal(again.events.filter((e) => e.payload.case === "agentStart").length, 1);
  const users = (await stack.gateway.getHistory({ sessionId: "passive-3" })).messages
    .filter((m) => m.role === Role.USER)
    .map((m) => m.frameId);
  assert.ok(!users.some((id) => dropped.includes(id)), "no dropped message ran");
});

test("a session with a client attached, or a run going, stays in memory", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("passive-2");
  await s.waitOpened();
  s.prompt("hello");
  await s.waitForPayload("agentEnd");
  await new Promise((r) => setTimeout(r, 1200));
  assert.ok(!stack.logs().includes("passivated session passive-2"), "an attached stream keeps it");
  s.prompt("!tokens 300 rate=200");
  await s.waitForPayload("agentEnd", 10_000, 5);
  s.close();
  assert.ok(!stack.logs().includes("passivated session passive-2"), "a run keeps it");
  await waitFor("passivation once let go", async () => stack.logs().includes("passivated session passive-2"), 10_000);
});
