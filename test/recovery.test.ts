// A runner killed mid-turn: nothing acknowledged is lost, the cut-off run goes on after the
// restart (RunResumed) with every tool call paired and none run twice, and what was queued runs.
import { sessionLogPath } from "../services/runner/store/jsonl-session-store.js";
import { refOf } from "../services/shared/session-ref.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { Role, StopReason, ToolVerdict } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../services/shared/errors.js";
import { AdminService } from "../services/shared/gen/troupe/v1/admin_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";

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

test("SIGKILL during a tool call: the run goes on after the restart, no finished call runs again, the follow-up runs", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("crash-1");
  await s.waitOpened();
  // Two exec calls in one batch, one after the other: the first finishes, the runner dies in the second.
  s.prompt("$$ echo ran >> /workspace/ran.txt ;; echo working; sleep 30");
  await s.waitFor((e) => e.payload.case === "toolExecutionUpdate" && e.payload.value.output.includes("working"));
  const followId = s.send({ case: "followUp", value: { text: "after the crash" } });
  await s.waitFor((e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === followId);
  const lastSeen = Number(s.events.at(-1)!.seq);
  const turnId = s.events.find((e) => e.payload.case === "agentStart")!.turnId;

  await stack.kill("runner", "SIGKILL");
  const st = await s.ended();
  assert.equal(st.code, 14, "the client's stream ends UNAVAILABLE when its runner dies");
  await stack.start("runner");

  // The client reconnects and resumes from the last event it saw; loading the session resumes the run.
  const again = await resume("crash-1", lastSeen);
  const followEnd = await again.waitFor(
    (e) => e.payload.case === "agentEnd" && e.payload.value.stopReason === StopReason.COMPLETED && e.turnId !== turnId,
    30_000,
  );
  const resumed = again.events.find((e) => e.payload.case === "runResumed");
  assert.ok(resumed && resumed.turnId === turnId, "the cut-off run goes on under its own turn");
  const cutEnd = again.events.find((e) => e.payload.case === "agentEnd" && e.turnId === turnId);
  assert.equal(cutEnd?.payload.case === "agentEnd" && cutEnd.payload.value.stopReason, StopReason.COMPLETED);
  assert.ok(Number(resumed.seq) > lastSeen, "seq continues after what the client saw, never reused");
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
  assert.ok(Number(followEnd.seq) > Number(cutEnd!.seq), "the follow-up ran after the resumed run");

  const history = await stack.gateway.getHistory({ sessionId: "crash-1" });
  assert.deepEqual(
    history.messages.map((m) => Role[m.role]),
    ["USER", "ASSISTANT", "TOOL", "TOOL", "ASSISTANT", "USER", "ASSISTANT"],
  );
  const [, asked, first, second, answer] = history.messages;
  assert.deepEqual(
    [first.toolCallId, second.toolCallId],
    asked.toolCalls.map((c) => c.id),
    "each call has one result",
  );
  assert.ok(!first.isError, "the finished call's result came from the log");
  assert.match(second.text, /^Interrupted: the runner stopped while this call ran/);
  assert.match(answer.text, /^Tool results: /, "the model was asked again from the last complete step");
  assert.equal(history.messages[5].frameId, followId);
  assert.equal(history.messages[6].text, "You said: after the crash");
  // The finished call ran once: its line is in the workspace once.
  const cat = new ChatSession(stack.gateway);
  cat.open("crash-1");
  await cat.waitOpened();
  const events = await cat.turn("$ cat /workspace/ran.txt", 30_000);
  cat.close();
  const output = events.find((e) => e.payload.case === "toolExecutionEnd");
  assert.match(output?.payload.case === "toolExecutionEnd" ? output.payload.value.result : "", /^ran\n\[exit 0\]$/);
  again.close();
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

test("SIGTERM: a turn that fits in the drain grace finishes before the runner exits", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("drain-1");
  await s.waitOpened();
  s.prompt("$ sleep 2; echo finished");
  await s.waitFor((e) => e.payload.case === "toolExecutionStart");
  const exited = stack.kill("runner", "SIGTERM");
  const end = await s.waitFor((e) => e.payload.case === "agentEnd", 20_000);
  assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
  const result = s.events.find((e) => e.payload.case === "toolExecutionEnd");
  assert.match(result?.payload.case === "toolExecutionEnd" ? result.payload.value.result : "", /finished/);
  assert.equal(await exited, 0);
  s.close();
  await stack.start("runner");
});

test("SIGTERM past the grace: the run is handed over, and the next runner goes on with it", async () => {
  await stack.kill("runner", "SIGTERM");
  await stack.startInstance("runner-short", "runner", { addr: stack.addr.runner, args: ["--drain-grace-ms", "1000"] });
  const s = new ChatSession(stack.gateway);
  s.open("drain-2");
  await s.waitOpened();
  s.prompt("$ echo started; sleep 30");
  await s.waitFor((e) => e.payload.case === "toolExecutionUpdate" && e.payload.value.output.includes("started"));
  const turnId = s.events.find((e) => e.payload.case === "agentStart")!.turnId;
  const lastSeen = Number(s.events.at(-1)!.seq);
  assert.equal(await stack.kill("runner-short", "SIGTERM"), 0);
  assert.ok(!s.events.some((e) => e.payload.case === "agentEnd"), "the run was not ended, only handed over");
  await stack.start("runner");
  const again = await resume("drain-2", lastSeen);
  const end = await again.waitFor((e) => e.payload.case === "agentEnd" && e.turnId === turnId, 30_000);
  again.close();
  assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
  assert.ok(again.events.some((e) => e.payload.case === "runResumed" && e.turnId === turnId));
  const history = await stack.gateway.getHistory({ sessionId: "drain-2" });
  assert.match(history.messages.find((m) => m.role === Role.TOOL)?.text ?? "", /^Interrupted: the runner stopped/);
});

describe("a tool call held for a person's approval, through real processes", () => {
  /** A session of an agent whose exec calls wait for a decision, waiting on its first one. */
  const heldSession = async (sessionId: string, agentId: string, approvals: object, command: string) => {
    await writeAgent(stack.dataDir, agentId, { approvals });
    const s = new ChatSession(stack.gateway);
    s.send({ case: "open", value: { sessionId, agentId, create: true } });
    await s.waitOpened();
    s.prompt(`$ ${command}`);
    const asked = await s.waitFor((e) => e.payload.case === "toolApprovalRequested");
    await s.waitFor((e) => e.payload.case === "runWaiting");
    const callId = asked.payload.case === "toolApprovalRequested" ? asked.payload.value.toolCallId : "";
    return { s, callId };
  };
  const pendingOf = async (sessionId: string) =>
    (await stack.gateway.listSessions({})).sessions.find((x) => x.sessionId === sessionId)?.pending ?? [];
  const code = async (p: Promise<unknown>) =>
    p.then(
      () => "taken",
      (err: { code: number }) => Status[err.code],
    );

  test("survives a SIGKILL, is listed, refuses strangers, and runs with an approver's edit", async () => {
    const { s, callId } = await heldSession(
      "held-1",
      "guarded",
      { tools: { exec: { mode: "ask", allowArguments: { command: ["echo [a-z]+"] } } } },
      "echo unsafe > /workspace/held.txt; cat /workspace/held.txt",
    );
    assert.ok(!s.events.some((e) => e.payload.case === "toolExecutionStart"), "nothing ran before the decision");
    const lastSeen = Number(s.events.at(-1)!.seq);
    await stack.kill("runner", "SIGKILL");
    await s.ended();
    await stack.start("runner");
    // The restarted runner adopts the session (its holder is gone) and lists what it waits on.
    const [pending] = await waitFor("the wait to be listed after the restart", async () => {
      const p = await pendingOf("held-1").catch(() => []);
      return p.length > 0 && p;
    });
    assert.equal(pending.toolCallId, callId);
    assert.equal(pending.toolName, "exec");
    assert.equal(pending.principal, "dev");
    assert.match(pending.rule, /exec: ask/);

    // Someone else of the tenant, not an approver: refused before anything is looked up.
    const mallory = await stack.gatewayAs("local", "mallory");
    const decide = { sessionId: "held-1", frameId: "m-1", toolCallId: callId, verdict: ToolVerdict.APPROVE };
    assert.equal(await code(mallory.decideToolCall({ ...decide, principal: "dev" })), "PERMISSION_DENIED");
    // In mallory's own namespace there is no such session.
    assert.equal(await code(mallory.decideToolCall(decide)), "NOT_FOUND");
    mallory.close();
    // An approver of another tenant reaches nothing of this one.
    const outsider = await stack.gatewayAs("acme", "boss", undefined, { role: "approver" });
    assert.equal(await code(outsider.decideToolCall({ ...decide, principal: "dev" })), "NOT_FOUND");
    outsider.close();

    const again = await resume("held-1", lastSeen);
    const boss = await stack.gatewayAs("local", "boss", undefined, { role: "approver" });
    const bad = {
      ...decide,
      frameId: "b-0",
      principal: "dev",
      verdict: ToolVerdict.EDIT,
      argumentsJson: '{"command": 7}',
    };
    assert.equal(await code(boss.decideToolCall(bad)), "INVALID_ARGUMENT");
    const edit = {
      ...bad,
      frameId: "b-1",
      argumentsJson: '{"command": "echo edited > /workspace/held.txt; cat /workspace/held.txt"}',
    };
    await boss.decideToolCall(edit);
    const end = await again.waitFor((e) => e.payload.case === "agentEnd", 30_000);
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
    // The same decision again is a duplicate; the run is over, so the call waits no more.
    assert.equal(await code(boss.decideToolCall({ ...edit, frameId: "b-2" })), "NOT_FOUND");
    boss.close();
    const decided = again.events.find((e) => e.payload.case === "toolDecided");
    assert.equal(decided?.payload.case === "toolDecided" && decided.payload.value.decidedBy, "boss");
    const ran = again.events.filter((e) => e.payload.case === "toolExecutionStart");
    assert.equal(ran.length, 1, "the call ran once");
    const result = (await stack.gateway.getHistory({ sessionId: "held-1" })).messages.find((m) => m.role === Role.TOOL);
    assert.match(result?.text ?? "", /edited by boss/);
    assert.match(result?.text ?? "", /^edited$/m, "the edited command is what ran");
    assert.doesNotMatch(result?.text ?? "", /unsafe/);
    assert.deepEqual(await pendingOf("held-1"), []);
    again.close();
    // The decision is an audit record: who, what, when.
    const admin = createClient(AdminService, stack.addr.gateway, {
      headers: { authorization: `Bearer ${await stack.keyFor("local", "ops", { role: "admin" })}` },
    });
    try {
      const audit = await waitFor("the decision's audit record", async () => {
        const { entries } = await admin.listAuditRecords({ sessionId: "held-1" });
        return entries.find((e) => e.action === "tool_decision");
      });
      assert.equal(audit.record?.decidedBy, "boss");
      assert.equal(audit.record?.verdict, "edited");
      assert.equal(audit.record?.toolCallId, callId);
      assert.ok(audit.time);
    } finally {
      admin.close();
    }
  });

  test("a client tool over the Chat stream: the call goes to the client, its result frame is taken once", async () => {
    const s = new ChatSession(stack.gateway);
    s.send({ case: "open", value: { sessionId: "client-tools-1", create: true } });
    await s.waitOpened();
    const weather = {
      name: "get_weather",
      description: "the weather in a city",
      parametersJson: JSON.stringify({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
    };
    s.send({ case: "prompt", value: { text: '!call get_weather {"city": "Oslo"}', clientTools: [weather] } });
    const sent = await s.waitFor((e) => e.payload.case === "clientToolCall");
    const callId = sent.payload.case === "clientToolCall" ? sent.payload.value.toolCallId : "";
    await s.waitFor((e) => e.payload.case === "runWaiting");
    // Another principal of the tenant reaches no such session: its result is refused.
    const mallory = await stack.gatewayAs("local", "mallory");
    const stranger = await mallory
      .submitToolResult({ sessionId: "client-tools-1", frameId: "x-1", toolCallId: callId, output: "lies" })
      .then(
        () => "taken",
        (err: { code: number }) => Status[err.code],
      );
    mallory.close();
    assert.equal(stranger, "NOT_FOUND");
    s.send({ case: "clientToolResult", value: { toolCallId: callId, output: "sunny" } }, "r-1");
    s.send({ case: "clientToolResult", value: { toolCallId: callId, output: "sunny" } }, "r-2");
    const end = await s.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
    // Sent twice, used once: the second is a duplicate while the first waits to be taken, or refused
    // once the run went on (nothing waits for it), and never a second answer.
    await s.until(() =>
      s.events.some(
        (e) => (e.payload.case === "frameAccepted" || e.payload.case === "error") && e.payload.value.frameId === "r-2",
      ),
    );
    assert.equal(s.events.filter((e) => e.payload.case === "clientToolAnswered").length, 1);
    const tools = (await stack.gateway.getHistory({ sessionId: "client-tools-1" })).messages.filter(
      (m) => m.role === Role.TOOL,
    );
    assert.deepEqual(
      tools.map((m) => m.text),
      ["sunny"],
    );
    s.close();
  });

  test("an abort ends a waiting run; the policy's timeout ends another", async () => {
    const aborted = await heldSession("held-2", "guarded-2", { tools: { exec: "ask" } }, "echo never");
    await stack.gateway.abort({ sessionId: "held-2", frameId: "stop-1", reason: "not now" });
    const end = await aborted.s.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.ABORTED);
    const answered = (await stack.gateway.getHistory({ sessionId: "held-2" })).messages.find(
      (m) => m.role === Role.TOOL,
    );
    assert.match(answered?.text ?? "", /aborted while this call waited for a decision \(not now\)/);
    aborted.s.close();

    const timed = await heldSession("held-3", "guarded-3", { tools: { exec: "ask" }, timeoutSeconds: 1 }, "echo never");
    const over = await timed.s.waitFor((e) => e.payload.case === "agentEnd", 10_000);
    assert.equal(over.payload.case === "agentEnd" && over.payload.value.stopReason, StopReason.COMPLETED);
    const decided = timed.s.events.find((e) => e.payload.case === "toolDecided");
    assert.equal(decided?.payload.case === "toolDecided" && decided.payload.value.decidedBy, "policy:timeout");
    const result = (await stack.gateway.getHistory({ sessionId: "held-3" })).messages.find((m) => m.role === Role.TOOL);
    assert.match(result?.text ?? "", /nobody decided in time/);
    timed.s.close();
  });
});
