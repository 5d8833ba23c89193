// What happens to a prompt that arrives while a run is going, mode by mode.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import path from "node:path";
import {
  FrameKind,
  QueueMode,
  Role,
  StopReason,
  type AgentEvent,
} from "../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../services/shared/errors.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.stop();
});

const ends = (s: ChatSession) =>
  s.events
    .filter((e) => e.payload.case === "agentEnd")
    .map((e) => (e.payload.case === "agentEnd" ? e.payload.value.stopReason : 0));
const runsStartedBy = (s: ChatSession) =>
  s.events
    .filter((e) => e.payload.case === "agentStart")
    .map((e) => (e.payload.case === "agentStart" ? e.payload.value.frameId : ""));
const applied = (e: AgentEvent) => e.payload.case === "queueApplied" && e.payload.value.frameId;

async function openSession(mode = QueueMode.UNSPECIFIED): Promise<ChatSession> {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { create: true, queueMode: mode } });
  await s.waitOpened();
  return s;
}

async function waitRuns(s: ChatSession, n: number, timeoutMs = 20_000): Promise<void> {
  await s.until(() => ends(s).length >= n, timeoutMs);
}

describe("queue modes", () => {
  test("default (steer): a prompt during a tool batch skips the unstarted calls and answers next", async () => {
    const s = await openSession();
    s.prompt("$$ sleep 1 ;; echo never");
    await s.waitForPayload("toolExecutionStart");
    const id = s.prompt("change of plan");
    await waitRuns(s, 1);
    s.close();
    assert.deepEqual(runsStartedBy(s).length, 1, "one run");
    const skipped = s.events.find((e) => e.payload.case === "toolCallsSkipped");
    assert.ok(skipped?.payload.case === "toolCallsSkipped" && skipped.payload.value.frameId === id);
    const last = s.events.filter((e) => e.payload.case === "messageEnd").at(-1)!;
    assert.ok(last.payload.case === "messageEnd" && last.payload.value.message!.text === "You said: change of plan");
  });

  test("followup: the prompt runs as its own run after the current one", async () => {
    const s = await openSession();
    const first = s.prompt("!tokens 100 rate=200");
    await s.waitForPayload("messageUpdate");
    const second = s.send({ case: "prompt", value: { text: "next", queueMode: QueueMode.FOLLOWUP } });
    await waitRuns(s, 2);
    s.close();
    assert.deepEqual(runsStartedBy(s), [first, second]);
    assert.deepEqual(ends(s), [StopReason.COMPLETED, StopReason.COMPLETED]);
    const firstEnd = s.events.findIndex((e) => e.payload.case === "agentEnd");
    const firstText = s.events.filter((e, i) => i < firstEnd && e.payload.case === "messageEnd").at(-1)!;
    assert.ok(
      firstText.payload.case === "messageEnd" && firstText.payload.value.message!.text.endsWith("t100 "),
      "the first run was not disturbed",
    );
  });

  test("collect: prompts within the quiet window run together as one run", async () => {
    const s = await openSession(QueueMode.COLLECT);
    s.prompt("!tokens 60 rate=200");
    await s.waitForPayload("messageUpdate");
    const a = s.prompt("first thought");
    await new Promise((r) => setTimeout(r, 100));
    const b = s.prompt("second thought");
    await waitRuns(s, 2, 20_000);
    await new Promise((r) => setTimeout(r, 800)); // nothing else runs after the window
    s.close();
    assert.equal(ends(s).length, 2, "the two prompts became one run");
    assert.equal(runsStartedBy(s)[1], a);
    const secondRun = s.events.filter(
      (e) => e.turnId === s.events.filter((x) => x.payload.case === "agentStart")[1].turnId,
    );
    assert.deepEqual(secondRun.map((e) => applied(e)).filter(Boolean), [a, b], "both applied, in arrival order");
    const users = secondRun.filter(
      (e) => e.payload.case === "messageEnd" && e.payload.value.message!.role === Role.USER,
    );
    assert.equal(users.length, 2, "each message kept whole");
    assert.equal(
      secondRun.filter((e) => e.payload.case === "messageStart" && e.payload.value.message!.role === Role.ASSISTANT)
        .length,
      1,
      "one model call answers both",
    );
  });

  test("interrupt: the running run is aborted (its tool call paired), then the prompt runs", async () => {
    const s = await openSession();
    s.prompt("$ sleep 30");
    await s.waitForPayload("toolExecutionStart");
    const id = s.send({ case: "prompt", value: { text: "stop and do this", queueMode: QueueMode.INTERRUPT } });
    await waitRuns(s, 2);
    s.close();
    assert.deepEqual(ends(s), [StopReason.ABORTED, StopReason.COMPLETED]);
    assert.equal(runsStartedBy(s)[1], id);
    const history = await stack.gateway.getHistory({ sessionId: s.opened!.sessionId });
    assert.deepEqual(
      history.messages.map((m) => Role[m.role]),
      ["USER", "ASSISTANT", "TOOL", "USER", "ASSISTANT"],
    );
    assert.equal(
      history.messages[2].toolCallId,
      history.messages[1].toolCalls[0].id,
      "the aborted call has its result",
    );
    assert.equal(history.messages[4].text, "You said: stop and do this");
  });

  test("reject: refused with FAILED_PRECONDITION while a run is going; nothing is recorded", async () => {
    const s = await openSession();
    s.prompt("!tokens 200 rate=200");
    await s.waitForPayload("messageUpdate");
    const id = s.send({ case: "prompt", value: { text: "not now", queueMode: QueueMode.REJECT } });
    const err = await s.waitFor((e) => e.payload.case === "error" && e.payload.value.frameId === id);
    assert.ok(err.payload.case === "error" && err.payload.value.code === "FAILED_PRECONDITION");
    await assert.rejects(
      stack.gateway.sendMessage({
        sessionId: s.opened!.sessionId,
        frameId: "u-rej",
        text: "not now either",
        queueMode: QueueMode.REJECT,
      }),
      {
        code: Status.FAILED_PRECONDITION,
      },
    );
    await waitRuns(s, 1);
    // The stream stays open and the session keeps working; the refused frame id can be reused.
    const again = s.send({ case: "prompt", value: { text: "now", queueMode: QueueMode.REJECT } }, id);
    await waitRuns(s, 2);
    s.close();
    assert.deepEqual(runsStartedBy(s).slice(1), [again]);
    const texts = (await stack.gateway.getHistory({ sessionId: s.opened!.sessionId })).messages
      .filter((m) => m.role === Role.USER)
      .map((m) => m.text);
    assert.deepEqual(texts, ["!tokens 200 rate=200", "now"]);
  });

  test("a session's default mode is kept with the session", async () => {
    const created = await stack.gateway.createSession({ queueMode: QueueMode.FOLLOWUP });
    const sessionId = created.session!.sessionId;
    const s = new ChatSession(stack.gateway);
    s.open(sessionId, false);
    await s.waitOpened();
    s.prompt("!tokens 80 rate=200");
    await s.waitForPayload("messageUpdate");
    const second = s.prompt("queued, not steering");
    await waitRuns(s, 2);
    s.close();
    assert.equal(runsStartedBy(s)[1], second);
    assert.ok(!s.events.some((e) => e.payload.case === "toolCallsSkipped"));
  });

  test("/stop, /kill and !kill typed as a message abort at once, and every abort is audited", async () => {
    const s = await openSession(QueueMode.FOLLOWUP);
    s.prompt("!tokens 5000 rate=200");
    await s.waitForPayload("messageUpdate");
    const stopId = s.prompt("/stop");
    await s.until(() => ends(s).length >= 1, 5000);
    assert.deepEqual(ends(s), [StopReason.ABORTED], "not queued behind the run in followup mode: it stopped it");
    const ack = s.events.find((e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === stopId)!;
    assert.ok(ack.payload.case === "frameAccepted" && ack.payload.value.kind === FrameKind.ABORT);
    // Unary, and while idle: an abort with nothing to stop; nothing is sent to the model.
    await stack.gateway.sendMessage({ sessionId: s.opened!.sessionId, frameId: "k1", text: "  !KILL " });
    await new Promise((r) => setTimeout(r, 300));
    s.close();
    assert.equal(runsStartedBy(s).length, 1);
    const history = await stack.gateway.getHistory({ sessionId: s.opened!.sessionId });
    assert.ok(!history.messages.some((m) => /stop|kill/i.test(m.text)), "stop commands never reach the conversation");
    const audit = (await readFile(path.join(stack.dataDir, "audit.jsonl"), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    const mine = audit.filter((r) => r.sessionId === s.opened!.sessionId);
    assert.deepEqual(
      mine.map((r) => [r.action, r.frameId]),
      [
        ["abort", stopId],
        ["abort", "k1"],
      ],
    );
    assert.match(mine[0].reason, /\/stop typed as a message/);
    assert.ok(mine[0].turnId.length > 0, "the aborted run is named");
    assert.equal(mine[1].turnId, "", "nothing was running");
  });

  test("a full mailbox refuses with RESOURCE_EXHAUSTED and drops nothing it accepted", async () => {
    const s = await openSession(QueueMode.FOLLOWUP);
    const first = s.prompt("!tokens 2000 rate=1000");
    await s.waitForPayload("messageUpdate");
    const ids: string[] = [];
    for (let i = 0; i < 110; i++) ids.push(s.prompt(`m${i}`));
    await s.until(
      () => s.events.filter((e) => e.payload.case === "frameAccepted" || e.payload.case === "error").length >= 111,
    );
    const accepted = s.events
      .filter((e) => e.payload.case === "frameAccepted")
      .map((e) => (e.payload.case === "frameAccepted" ? e.payload.value.frameId : ""));
    const refused = s.events
      .filter((e) => e.payload.case === "error")
      .map((e) => (e.payload.case === "error" ? [e.payload.value.code, e.payload.value.frameId] : []));
    assert.equal(accepted.length - 1, 100, "the mailbox holds 100");
    assert.deepEqual(
      refused,
      ids.slice(100).map((id) => ["RESOURCE_EXHAUSTED", id]),
    );
    // Every accepted prompt runs, once, in the order it arrived.
    await waitRuns(s, 101, 90_000);
    s.close();
    assert.deepEqual(runsStartedBy(s), [first, ...ids.slice(0, 100)]);
  });
});
