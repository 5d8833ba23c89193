// A runner killed mid-turn: nothing acknowledged is lost, the cut-off run is recorded as
// interrupted with every tool call paired, and what was queued runs after the restart.
import { sessionLogPath } from "../services/runner/session-log.js";
import { refOf } from "../services/shared/session-ref.js";
import { DEV_IDENTITY } from "../services/shared/auth.js";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { Role, StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.stop();
});

/** A client's stream to the session, resumed after `afterSeq`, once the restarted runner serves it again. */
async function resume(sessionId: string, afterSeq: number): Promise<ChatSession> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const s = new ChatSession(stack.gateway);
    s.send({ case: "open", value: { sessionId, replayAfterSeq: BigInt(afterSeq) } });
    try {
      await s.waitOpened(3000);
      return s;
    } catch (err) {
      s.close();
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

test("SIGKILL during a tool call: the run is interrupted, the follow-up survives and runs", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("crash-1");
  await s.waitOpened();
  s.prompt("$ echo working; sleep 30");
  await s.waitFor((e) => e.payload.case === "toolExecutionUpdate");
  const followId = s.send({ case: "followUp", value: { text: "after the crash" } });
  await s.waitFor((e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === followId);
  const lastSeen = Number(s.events.at(-1)!.seq);

  await stack.kill("runner", "SIGKILL");
  const st = await s.ended();
  assert.equal(st.code, 14, "the client's stream ends UNAVAILABLE when its runner dies");
  await stack.start("runner");

  // The client reconnects and resumes from the last event it saw.
  const again = await resume("crash-1", lastSeen);
  const followEnd = await again.waitFor(
    (e) => e.payload.case === "agentEnd" && e.payload.value.stopReason === StopReason.COMPLETED,
    20_000,
  );
  again.close();

  const interrupted = again.events.find(
    (e) => e.payload.case === "agentEnd" && e.payload.value.stopReason === StopReason.INTERRUPTED,
  );
  assert.ok(interrupted, "the cut-off run is recorded as interrupted");
  assert.ok(Number(interrupted.seq) > lastSeen, "seq continues after what the client saw, never reused");
  const gap = again.events[0];
  assert.ok(gap.payload.case === "gap", "the seqs skipped after the crash are reported as a gap");
  assert.equal(Number(gap.payload.value.firstSeq), lastSeen + 1);
  assert.equal(Number(again.events[1].seq), Number(gap.seq) + 1, "and numbering continues right after it");
  const seqs = again.events.map((e) => Number(e.seq));
  assert.deepEqual(
    seqs,
    [...seqs].sort((a, b) => a - b),
    "in order",
  );
  assert.equal(new Set(seqs).size, seqs.length, "each event once");
  assert.ok(
    again.events.some((e) => e.payload.case === "queueApplied" && e.payload.value.frameId === followId),
    "the follow-up ran",
  );
  assert.ok(Number(followEnd.seq) > Number(interrupted.seq));

  const history = await stack.gateway.getHistory({ sessionId: "crash-1" });
  const roles = history.messages.map((m) => Role[m.role]);
  assert.deepEqual(roles, ["USER", "ASSISTANT", "TOOL", "USER", "ASSISTANT"]);
  assert.equal(history.messages[2].toolCallId, history.messages[1].toolCalls[0].id, "the cut-off call has its result");
  assert.match(history.messages[2].text, /Interrupted/);
  assert.equal(history.messages[3].frameId, followId);
  assert.equal(history.messages[4].text, "You said: after the crash");
});

test("a runner killed before a new session's events reached its log: the reload numbers past every seq a client holds", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("crash-2");
  await s.waitOpened();
  const promptId = s.prompt("hello");
  await s.waitForPayload("agentEnd");
  const lastSeen = Number(s.events.at(-1)!.seq);
  await stack.kill("runner", "SIGKILL");
  await s.ended();

  // Events reach clients before the log has them. Cut the log back to what a runner killed right
  // after the prompt's fsync leaves: the prompt, and none of the events the client saw.
  const file = sessionLogPath(stack.dataDir, refOf(DEV_IDENTITY, "crash-2"));
  const lines = (await readFile(file, "utf8")).split("\n").filter(Boolean);
  const lastFrame = lines.findLastIndex((l) => (JSON.parse(l) as { t: string }).t === "frame");
  assert.ok(lastFrame > 0 && lastFrame < lines.length - 1, "the log holds the prompt and events after it");
  await writeFile(file, `${lines.slice(0, lastFrame + 1).join("\n")}\n`);
  await stack.start("runner");

  const again = await resume("crash-2", lastSeen);
  // The prompt is owed its acknowledgement and its run again; a client resuming after lastSeen
  // sees both, which it would not if they reused seqs it already held.
  const ack = await again.waitFor((e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === promptId);
  assert.ok(Number(ack.seq) > lastSeen, `the acknowledgement's seq ${ack.seq} is past ${lastSeen}`);
  await again.waitFor(
    (e) => e.payload.case === "agentEnd" && e.payload.value.stopReason === StopReason.COMPLETED,
    20_000,
  );
  again.close();
  const seqs = again.events.map((e) => Number(e.seq));
  assert.ok(
    seqs.every((q) => q > lastSeen),
    "nothing at or before what the client saw",
  );
  assert.equal(new Set(seqs).size, seqs.length, "each event once");

  const history = await stack.gateway.getHistory({ sessionId: "crash-2" });
  assert.deepEqual(
    history.messages.map((m) => `${Role[m.role]} ${m.text}`),
    ["USER hello", "ASSISTANT You said: hello"],
  );
});
