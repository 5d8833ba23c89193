// A2A's pieces in process (gateway/a2a/): a run's events as a task and its updates, a caller's key
// kept only for A2A's own calls and never taken from the client, and errors that carry A2A's
// ErrorInfo reason and domain.
import { test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary } from "@bufbuild/protobuf";
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { grpc } from "../../services/shared/rpc.js";
import { AgentEventSchema, Role, StopReason } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { TaskState } from "../../services/shared/gen/lf/a2a/v1/a2a_pb.js";
import { ErrorInfoSchema } from "../../services/shared/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../../services/shared/gen/google/rpc/status_pb.js";
import { TaskFold } from "../../services/gateway/a2a/task-fold.js";
import { CALLER_KEY, keepingCallerKey } from "../../services/gateway/a2a/grpc-binding.js";
import { a2aErrorOf, invalidParams } from "../../services/gateway/a2a/a2a-core.js";
import { Status, toStatus } from "../../services/shared/errors.js";

const ev = (seq: number, payload: object) =>
  create(AgentEventSchema, { sessionId: "s", seq: BigInt(seq), turnId: "t", payload: payload as never });
const message = (id: string, role: Role, text = "") => ({ id, role, text });

test("a run folds into a task: working, the reply in chunks, the last chunk, then completed", () => {
  const fold = new TaskFold("task-1", "ctx");
  const updates = [
    ev(1, { case: "agentStart", value: { frameId: "f" } }),
    ev(2, { case: "messageEnd", value: { message: message("u", Role.USER, "hi") } }),
    ev(3, { case: "messageStart", value: { message: message("a1", Role.ASSISTANT) } }),
    ev(4, { case: "messageUpdate", value: { messageId: "a1", delta: { case: "text", value: "one" } } }),
    ev(5, { case: "messageEnd", value: { message: message("a1", Role.ASSISTANT, "one") } }),
    ev(6, { case: "messageStart", value: { message: message("a2", Role.ASSISTANT) } }),
    ev(7, { case: "messageEnd", value: { message: message("a2", Role.ASSISTANT, "two") } }),
    ev(8, { case: "agentEnd", value: { stopReason: StopReason.COMPLETED } }),
  ].flatMap((e) => fold.take(e));
  const kinds = updates.map((u) =>
    u.payload.case === "artifactUpdate"
      ? `chunk:${u.payload.value.artifact?.parts[0].content.value}${u.payload.value.append ? "+" : ""}${u.payload.value.lastChunk ? "!" : ""}`
      : u.payload.case === "statusUpdate"
        ? TaskState[u.payload.value.status!.state]
        : u.payload.case,
  );
  assert.deepEqual(kinds, ["WORKING", "chunk:one", "chunk:\n\n+", "chunk:two+", "chunk:+!", "COMPLETED"]);
  assert.equal(fold.task.artifacts[0].parts[0].content.value, "one\n\ntwo");
  assert.deepEqual(
    fold.task.history.map((m) => m.parts[0].content.value),
    ["hi", "one", "two"],
  );
  assert.ok(fold.done);
  assert.deepEqual(fold.take(ev(9, { case: "agentStart", value: {} })), [], "nothing after the end");

  const failed = new TaskFold("task-2", "ctx");
  failed.take(ev(1, { case: "agentStart", value: {} }));
  failed.take(ev(2, { case: "agentEnd", value: { stopReason: StopReason.ERROR, errorMessage: "model down" } }));
  assert.equal(failed.state, TaskState.FAILED);
  assert.equal(failed.task.status?.message?.parts[0].content.value, "model down");
});

test("a caller's key is kept for A2A's calls only, never taken from what the client sent", () => {
  const seen: string[] = [];
  const auth = keepingCallerKey((md) => {
    seen.push(String(md.get("authorization")[0]));
    md.remove("authorization");
  });
  const a2a = new grpc.Metadata();
  a2a.set("authorization", "Bearer k1");
  a2a.set(CALLER_KEY, "Bearer forged");
  auth(a2a, "/lf.a2a.v1.A2AService/GetTask");
  assert.equal(a2a.get(CALLER_KEY)[0], "Bearer k1");
  const other = new grpc.Metadata();
  other.set("authorization", "Bearer k2");
  other.set(CALLER_KEY, "Bearer forged");
  auth(other, "/troupe.v1.GatewayService/GetHistory");
  assert.deepEqual(other.get(CALLER_KEY), []);
  assert.deepEqual(seen, ["Bearer k1", "Bearer k2"]);
});

test("A2A errors carry their reason and domain in ErrorInfo; other failures keep their status", () => {
  const status = toStatus(invalidParams("bad"));
  assert.equal(status.code, Status.INVALID_ARGUMENT);
  const details = fromBinary(StatusSchema, status.metadata!.get("grpc-status-details-bin")[0] as Buffer);
  const info = anyUnpack(details.details[0], ErrorInfoSchema);
  assert.equal(info?.reason, "INVALID_PARAMS");
  assert.equal(info?.domain, "a2a-protocol.org");
  const unavailable = a2aErrorOf(Object.assign(new Error("x"), { code: Status.UNAVAILABLE, details: "runner gone" }));
  assert.equal(unavailable.code, Status.UNAVAILABLE);
  assert.equal(unavailable.jsonRpcCode, -32603);
});
