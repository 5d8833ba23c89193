// End to end through real processes: client -> gateway -> runner (-> model server, sandbox,
// memory) and back. Each assertion is about what a gRPC client observes.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { StopReason, Role, FrameKind, type AgentEvent } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession, subscribeUntil } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.stop();
});

/** seq starts right after the open's last_seq and rises by exactly one per event. */
function assertGapless(events: AgentEvent[], first: number): void {
  for (const [i, e] of events.entries()) {
    assert.equal(Number(e.seq), first + i, `event ${i} (${e.payload.case}) has seq ${e.seq}, expected ${first + i}`);
  }
}

describe("a conversation with a tool call", () => {
  test("streams every step in order with a gapless seq, and history keeps it", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    const opened = await s.waitOpened();
    assert.ok(opened.created);
    const promptId = s.prompt("$ echo hello from the sandbox");
    await s.waitForPayload("agentEnd", 30_000);
    const secondId = s.prompt("thanks");
    const end2 = await s.waitFor(
      (e) => e.payload.case === "agentEnd" && e.turnId !== s.events.find((x) => x.payload.case === "agentEnd")!.turnId,
    );
    s.close();

    assertGapless(s.events, Number(opened.lastSeq) + 1);
    const firstRun = s.events.filter((e) => e.turnId === s.events[1].turnId);
    assert.deepEqual(
      firstRun
        .map((e) => e.payload.case)
        .filter((c) => c !== "messageUpdate" && c !== "toolExecutionUpdate" && c !== "usage"),
      [
        "agentStart",
        "turnStart",
        "queueApplied",
        "messageStart",
        "messageEnd", // the user message
        "messageStart",
        "messageEnd", // assistant asks for exec
        "toolExecutionStart",
        "toolExecutionEnd",
        "messageStart",
        "messageEnd", // tool result
        "turnEnd",
        "turnStart",
        "messageStart",
        "messageEnd",
        "turnEnd", // final answer
        "agentEnd",
      ],
    );
    const ack = s.events[0];
    assert.equal(ack.payload.case, "frameAccepted");
    assert.equal(ack.payload.case === "frameAccepted" && ack.payload.value.frameId, promptId);

    const toolEnd = firstRun.find((e) => e.payload.case === "toolExecutionEnd")!;
    assert.ok(toolEnd.payload.case === "toolExecutionEnd");
    assert.equal(toolEnd.payload.value.isError, false);
    assert.match(toolEnd.payload.value.result, /hello from the sandbox\n\[exit 0\]/);
    assert.ok(
      firstRun.some(
        (e) => e.payload.case === "toolExecutionUpdate" && /hello from the sandbox/.test(e.payload.value.output),
      ),
      "output streamed",
    );

    const end1 = firstRun.at(-1)!;
    assert.ok(end1.payload.case === "agentEnd");
    assert.equal(end1.payload.value.stopReason, StopReason.COMPLETED);
    assert.ok(end1.payload.value.usage!.outputTokens > 0, "usage summed over the run");
    assert.ok(end2.payload.case === "agentEnd" && end2.payload.value.stopReason === StopReason.COMPLETED);

    const history = await stack.gateway.getHistory({ sessionId: opened.sessionId });
    assert.deepEqual(
      history.messages.map((m) => Role[m.role]),
      ["USER", "ASSISTANT", "TOOL", "ASSISTANT", "USER", "ASSISTANT"],
    );
    assert.equal(history.messages[0].frameId, promptId);
    assert.equal(history.messages[4].frameId, secondId);
    assert.equal(
      history.messages[2].toolCallId,
      history.messages[1].toolCalls[0].id,
      "the result is paired with its call",
    );
    assert.equal(history.messages[5].text, "You said: thanks");

    const paged = await stack.gateway.getHistory({ sessionId: opened.sessionId, pageSize: 4 });
    assert.equal(paged.messages.length, 4);
    const rest = await stack.gateway.getHistory({
      sessionId: opened.sessionId,
      pageSize: 4,
      pageToken: paged.nextPageToken,
    });
    assert.equal(rest.messages.length, 2);
    assert.equal(rest.nextPageToken, "");

    const listed = await stack.gateway.listSessions({});
    const info = listed.sessions.find((x) => x.sessionId === opened.sessionId);
    assert.ok(info, "the session is listed");
    assert.equal(info.agentId, "main");
    assert.equal(Number(info.lastSeq), Number(s.events.at(-1)!.seq));
  });

  test("a resent frame id is acknowledged again and acted on once", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    s.send({ case: "prompt", value: { text: "once" } }, "same-id");
    await s.waitForPayload("agentEnd");
    s.send({ case: "prompt", value: { text: "once" } }, "same-id");
    const dup = await s.waitFor((e) => e.payload.case === "frameAccepted" && e.payload.value.duplicate);
    await new Promise((r) => setTimeout(r, 300));
    s.close();
    assert.ok(dup.payload.case === "frameAccepted" && dup.payload.value.frameId === "same-id");
    assert.equal(s.events.filter((e) => e.payload.case === "agentStart").length, 1, "no second run");
  });

  test("Subscribe(after_seq) delivers every later event once, in order", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    const opened = await s.waitOpened();
    s.prompt("!tokens 20");
    await s.waitForPayload("agentEnd");
    s.close();
    const all = s.events;
    const cut = Number(all[5].seq);
    const got = await subscribeUntil(stack.gateway, opened.sessionId, BigInt(cut), 1);
    assert.deepEqual(
      got.map((e) => Number(e.seq)),
      all.filter((e) => Number(e.seq) > cut).map((e) => Number(e.seq)),
    );
  });

  test("unary send, steer, follow-up and abort are acknowledged with their frame ids", async () => {
    const created = await stack.gateway.createSession({});
    const sessionId = created.session!.sessionId;
    const sent = await stack.gateway.sendMessage({ sessionId, frameId: "u1", text: "!tokens 300 rate=100" });
    assert.ok(sent.accepted?.payload.case === "frameAccepted" && sent.accepted.payload.value.frameId === "u1");
    const follow = await stack.gateway.followUp({ sessionId, frameId: "u2", text: "after that" });
    assert.ok(
      follow.accepted?.payload.case === "frameAccepted" && follow.accepted.payload.value.kind === FrameKind.FOLLOW_UP,
    );
    const aborted = await stack.gateway.abort({ sessionId, frameId: "u3", reason: "test" });
    assert.ok(
      aborted.accepted?.payload.case === "frameAccepted" && aborted.accepted.payload.value.kind === FrameKind.ABORT,
    );
    // The follow-up survives the abort and runs next.
    const seen = await subscribeUntil(stack.gateway, sessionId, 0n, 2);
    const ends = seen
      .filter((e) => e.payload.case === "agentEnd")
      .map((e) => (e.payload.case === "agentEnd" ? e.payload.value.stopReason : 0));
    assert.deepEqual(ends, [StopReason.ABORTED, StopReason.COMPLETED]);
    const history = await stack.gateway.getHistory({ sessionId });
    assert.equal(history.messages.at(-1)!.text, "You said: after that");
  });
});

describe("backpressure", () => {
  test("a client that stops reading stops the model stream; when it reads again every token arrives", async () => {
    const N = 400_000;
    const written = async () =>
      ((await (await fetch(`http://${stack.addr["model-server"]}/stats`)).json()) as { chunks_written: number })
        .chunks_written;
    const before = await written();
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    s.prompt(`!tokens ${N}`);
    await s.waitForPayload("messageUpdate", 20_000);
    s.call.pause();
    // Buffers fill along the path, then nothing moves: the model server is held back too.
    let last = -1;
    const stalled = await waitFor(
      "the model server to stop writing",
      async () => {
        const now = await written();
        const still = now === last;
        last = now;
        return still ? now : false;
      },
      20_000,
      1000,
    );
    assert.ok(
      stalled - before < N,
      `the model server wrote ${stalled - before} of ${N} chunks while the client was not reading`,
    );
    s.call.resume();
    const end = await s.waitForPayload("agentEnd", 60_000);
    s.close();
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED);
    const text = s.events
      .map((e) =>
        e.payload.case === "messageUpdate" && e.payload.value.delta.case === "text" ? e.payload.value.delta.value : "",
      )
      .join("");
    assert.ok(text.endsWith(`t${N} `), "the last token arrived");
    assert.equal(
      text.length,
      Array.from({ length: N }, (_, i) => `t${i + 1} `.length).reduce((a, b) => a + b, 0),
      "every token arrived, once",
    );
  });
});

describe("abort and steering", () => {
  test("an abort during streaming ends the run as aborted within 1 s", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    s.prompt("!tokens 5000 rate=200");
    await s.waitForPayload("messageUpdate");
    const t0 = performance.now();
    s.send({ case: "abort", value: { reason: "changed my mind" } });
    const end = await s.waitForPayload("agentEnd", 5000);
    const elapsed = performance.now() - t0;
    s.close();
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.ABORTED);
    assert.ok(elapsed < 1000, `abort took ${elapsed.toFixed(0)} ms`);
    const partial = s.events.filter((e) => e.payload.case === "messageEnd").at(-1)!;
    assert.ok(
      partial.payload.case === "messageEnd" && partial.payload.value.message!.stopReason === StopReason.ABORTED,
    );
    const streamed = s.events
      .map((e) =>
        e.payload.case === "messageUpdate" && e.payload.value.delta.case === "text" ? e.payload.value.delta.value : "",
      )
      .join("");
    assert.ok(streamed.startsWith("t1 "));
    assert.equal(partial.payload.value.message!.text, streamed, "the partial reply kept is exactly what was streamed");
  });

  test("an abort during a sandbox command kills it and ends the run", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    const opened = await s.waitOpened();
    s.prompt("$ echo started; sleep 60; echo never");
    await s.waitFor((e) => e.payload.case === "toolExecutionUpdate");
    const t0 = performance.now();
    s.send({ case: "abort", value: {} });
    const end = await s.waitForPayload("agentEnd", 5000);
    const elapsed = performance.now() - t0;
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.ABORTED);
    assert.ok(elapsed < 2000, `abort took ${elapsed.toFixed(0)} ms`);
    const toolEnd = s.events.find((e) => e.payload.case === "toolExecutionEnd")!;
    assert.ok(toolEnd.payload.case === "toolExecutionEnd" && toolEnd.payload.value.isError);
    // The sleep is gone: a new command in the same sandbox sees no such process.
    s.prompt("$ ps -o args | grep -c '[s]leep 60' || true");
    const next = await s.waitFor((e) => e.payload.case === "toolExecutionEnd" && e.turnId !== end.turnId);
    s.close();
    assert.ok(next.payload.case === "toolExecutionEnd");
    assert.match(
      next.payload.value.result,
      /^0\n/,
      `sleep still running in ${opened.sessionId}: ${next.payload.value.result}`,
    );
  });

  test("a steer during a tool batch skips the unstarted calls and is applied before the next model call", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    s.prompt("$$ sleep 1; echo first ;; echo second ;; echo third");
    await s.waitForPayload("toolExecutionStart");
    const steerId = s.send({ case: "steer", value: { text: "stop, do something else" } });
    const end = await s.waitForPayload("agentEnd", 20_000);
    s.close();
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED);

    const ends = s.events
      .filter((e) => e.payload.case === "toolExecutionEnd")
      .map((e) => (e.payload.case === "toolExecutionEnd" ? e.payload.value : undefined)!);
    assert.equal(ends.length, 3, "every call has a result");
    assert.equal(ends[0].skipped, false, "the running call finished");
    assert.match(ends[0].result, /first/);
    assert.deepEqual(
      ends.slice(1).map((e) => [e.skipped, e.isError, e.result]),
      [
        [true, true, "Skipped due to queued user message."],
        [true, true, "Skipped due to queued user message."],
      ],
    );
    const skipped = s.events.find((e) => e.payload.case === "toolCallsSkipped")!;
    assert.ok(skipped.payload.case === "toolCallsSkipped");
    assert.equal(skipped.payload.value.frameId, steerId);
    assert.deepEqual(
      skipped.payload.value.toolCallIds,
      ends.slice(1).map((e) => e.toolCallId),
    );

    // Order: skip -> steer applied -> steer message -> next model call answers the steer.
    const idx = (pred: (e: AgentEvent) => boolean) => s.events.findIndex(pred);
    const iSkip = idx((e) => e.payload.case === "toolCallsSkipped");
    const iApplied = idx((e) => e.payload.case === "queueApplied" && e.payload.value.frameId === steerId);
    const iNextAssistant = s.events.findIndex(
      (e, i) => i > iApplied && e.payload.case === "messageStart" && e.payload.value.message!.role === Role.ASSISTANT,
    );
    assert.ok(
      iSkip < iApplied && iApplied < iNextAssistant,
      `order skip ${iSkip} < applied ${iApplied} < next model call ${iNextAssistant}`,
    );
    const finalText = s.events.filter((e) => e.payload.case === "messageEnd").at(-1)!;
    assert.ok(finalText.payload.case === "messageEnd");
    assert.equal(finalText.payload.value.message!.text, "You said: stop, do something else");
  });
});
