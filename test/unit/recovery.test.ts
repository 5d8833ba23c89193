// Recovery read straight off log records: where numbering resumes after a clean close and after a
// crash, what state a log holds, how a cut-off run is closed, and supervision's restart budget.
import { test } from "node:test";
import assert from "node:assert/strict";
import { create, toJson } from "@bufbuild/protobuf";
import {
  AgentEventSchema,
  ChatMessageSchema,
  ClientFrameSchema,
  QueueMode,
  Role,
  StopReason,
} from "../../services/shared/gen/troupe/v1/session_pb.js";
import {
  INTERRUPTED,
  RESTART_LIMIT,
  RESTART_WINDOW_MS,
  RestartBudget,
  closeCutOffRun,
  replayRecords,
  resumeSeq,
} from "../../services/runner/session/recovery.js";
import type { LogRecord } from "../../services/runner/session/session-log.js";
import type { EventPayload } from "../../services/runner/loop/run.js";

const header: LogRecord = { t: "session", sessionId: "s", agentId: "main", createdMs: 1 };
const event = (seq: number, payload: EventPayload, turnId = ""): LogRecord => ({
  t: "event",
  event: toJson(AgentEventSchema, create(AgentEventSchema, { seq: BigInt(seq), turnId, payload })),
});
const prompt = (frameId: string): LogRecord => ({
  t: "frame",
  frame: toJson(
    ClientFrameSchema,
    create(ClientFrameSchema, { frameId, kind: { case: "prompt", value: { text: frameId } } }),
  ),
});

test("numbering resumes at the last seq after a clean close, past the reservation after a crash", () => {
  const events = [header, { t: "seq", upTo: 64 } as LogRecord, event(1, { case: "agentStart", value: {} })];
  assert.equal(resumeSeq(events), 64, "a crash: seqs up to the reservation may be out");
  assert.equal(resumeSeq([...events, { t: "closed", seq: 1 }]), 1, "a clean close");
  assert.equal(
    resumeSeq([...events, { t: "closed", seq: 1 }, { t: "epoch", epoch: 2, runnerId: "r" }]),
    1,
    "a clean close followed only by the next activation's epoch still counts",
  );
  assert.equal(
    resumeSeq([...events, { t: "closed", seq: 1 }, { t: "seq", upTo: 128 }]),
    128,
    "a reservation after the close: the next activation crashed",
  );
});

test("replay: history, acknowledgements, drops, queue mode, compaction and an open turn", () => {
  const user = create(ChatMessageSchema, { id: "m1", role: Role.USER, text: "a", frameId: "f1" });
  const log = replayRecords([
    header,
    { t: "settings", queueMode: QueueMode.COLLECT },
    prompt("f1"),
    event(1, { case: "frameAccepted", value: { frameId: "f1" } }),
    event(2, { case: "frameAccepted", value: { frameId: "f1", duplicate: true } }),
    event(3, { case: "messageEnd", value: { message: user } }),
    prompt("f2"),
    event(4, { case: "error", value: { code: "CANCELLED", frameId: "f2" } }),
    event(5, { case: "compactionEnd", value: { summary: "so far", firstKeptMessageId: "m1" } }),
    event(6, { case: "agentStart", value: {} }, "turn-1"),
    { t: "some-future-record" } as unknown as LogRecord,
  ]);
  assert.equal(log.queueMode, QueueMode.COLLECT);
  assert.deepEqual(
    log.messages.map((m) => m.id),
    ["m1"],
  );
  assert.equal(Number(log.acks.get("f1")?.seq), 1, "the first acknowledgement, not the duplicate");
  assert.deepEqual([...log.dropped], ["f2"]);
  assert.deepEqual(
    log.accepted.map((f) => f.frameId),
    ["f1", "f2"],
  );
  assert.deepEqual(log.compaction, { summary: "so far", firstKeptMessageId: "m1" });
  assert.equal(log.lastSeq, 6);
  assert.equal(log.openTurn, "turn-1");
  assert.equal(replayRecords([header, event(7, { case: "agentEnd", value: {} }, "turn-1")]).openTurn, undefined);
});

test("elided messages leave the replayed history; their events stay in the log", () => {
  const end = (id: string, text: string) =>
    event(1, { case: "messageEnd", value: { message: { id, role: Role.USER, text } } });
  const log = replayRecords([
    header,
    end("m1", "kept"),
    end("m2", "beat"),
    end("m3", "HEARTBEAT_OK"),
    { t: "elided", messageIds: ["m2", "m3"] },
  ]);
  assert.deepEqual(
    log.messages.map((m) => m.text),
    ["kept"],
  );
});

test("a cut-off run: its starters join the history, every unanswered call gets an error, then agent_end", () => {
  const messages = [
    create(ChatMessageSchema, {
      id: "a1",
      role: Role.ASSISTANT,
      toolCalls: [
        { id: "c1", name: "bash" },
        { id: "c2", name: "read" },
      ],
    }),
    create(ChatMessageSchema, { id: "t1", role: Role.TOOL, toolCallId: "c1", text: "ok" }),
  ];
  const emitted: EventPayload[] = [];
  closeCutOffRun((p) => emitted.push(p), messages, INTERRUPTED, [
    { frameId: "f9", kind: "prompt", text: "hello" } as never,
  ]);
  assert.deepEqual(
    emitted.map((p) => p.case),
    ["queueApplied", "messageStart", "messageEnd", "toolExecutionEnd", "messageEnd", "agentEnd"],
  );
  const answer = messages.at(-1)!;
  assert.equal(answer.toolCallId, "c2", "only the unanswered call");
  assert.ok(answer.isError && answer.text.includes(INTERRUPTED.message));
  assert.ok(messages.some((m) => m.role === Role.USER && m.frameId === "f9"));
  const end = emitted.at(-1) as Extract<EventPayload, { case: "agentEnd" }>;
  assert.equal(end.value.stopReason, StopReason.INTERRUPTED);
});

test("the restart budget doubles its backoff and is spent by the fifth failure in the window", () => {
  const budget = new RestartBudget();
  const backoffs: number[] = [];
  for (let i = 0; i < RESTART_LIMIT - 1; i++) {
    const { backoffMs, failed } = budget.spend(1000 + i);
    backoffs.push(backoffMs);
    assert.equal(failed, undefined);
  }
  assert.deepEqual(backoffs, [100, 200, 400, 800]);
  assert.match(budget.spend(1010).failed ?? "", /5 unexpected failures/);
  const later = new RestartBudget();
  later.spend(0);
  assert.deepEqual(later.spend(RESTART_WINDOW_MS + 1), { backoffMs: 100, failed: undefined }, "old failures age out");
});
