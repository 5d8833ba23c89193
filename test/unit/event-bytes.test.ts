// The hand-written encoding of token deltas must be byte for byte what protobuf-es writes, and
// must decode back to the same event; everything else goes through protobuf-es.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { AttachResponseSchema } from "../../services/shared/gen/troupe/v1/runner_pb.js";
import { AgentEventSchema, type AgentEvent } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { attachEventBytes } from "../../services/runner/session/event-bytes.js";

const reference = (event: AgentEvent) =>
  toBinary(AttachResponseSchema, create(AttachResponseSchema, { kind: { case: "event", value: event } }));

function delta(
  kind: "text" | "thinking",
  text: string,
  over: {
    sessionId?: string;
    seq?: bigint;
    turnId?: string;
    messageId?: string;
    seconds?: bigint;
    nanos?: number;
  } = {},
): AgentEvent {
  return create(AgentEventSchema, {
    sessionId: over.sessionId ?? "s-1",
    seq: over.seq ?? 7n,
    turnId: over.turnId ?? "turn-1",
    time: { seconds: over.seconds ?? 1_764_190_000n, nanos: over.nanos ?? 123_000_000 },
    payload: {
      case: "messageUpdate",
      value: { messageId: over.messageId ?? "m-1", delta: { case: kind, value: text } },
    },
  });
}

describe("attachEventBytes", () => {
  test("a text or thinking delta encodes exactly as protobuf-es encodes it", () => {
    const texts = [
      "",
      "a",
      "héllo wörld",
      "日本語のテキスト",
      "emoji 👩‍💻 and a lone \ud800 surrogate",
      "x".repeat(127),
      "y".repeat(128),
      "z".repeat(20_000),
    ];
    for (const kind of ["text", "thinking"] as const)
      for (const text of texts) {
        const event = delta(kind, text);
        assert.deepEqual(
          Buffer.from(attachEventBytes(event)),
          Buffer.from(reference(event)),
          `${kind} ${text.slice(0, 20)}`,
        );
      }
  });

  test("zero and empty fields are left out as protobuf-es leaves them out; large numbers take long varints", () => {
    const cases: AgentEvent[] = [
      delta("text", "t", { sessionId: "", turnId: "", messageId: "" }),
      delta("text", "t", { seq: 0n, seconds: 0n, nanos: 0 }),
      delta("text", "t", { seq: 2n ** 40n + 5n, seconds: 2n ** 35n, nanos: 999_999_999 }),
      delta("text", "t", { seq: BigInt(Number.MAX_SAFE_INTEGER) }),
      delta("thinking", "t", { sessionId: "s".repeat(300), turnId: "ü".repeat(200) }),
    ];
    for (const event of cases) assert.deepEqual(Buffer.from(attachEventBytes(event)), Buffer.from(reference(event)));
  });

  test("the bytes decode back to the same event", () => {
    const event = delta("text", "round trip ✓", { seq: 123_456n });
    const back = fromBinary(AttachResponseSchema, attachEventBytes(event));
    assert.equal(back.kind.case, "event");
    assert.deepEqual(back.kind.value, event);
  });

  test("other events, and deltas it does not write by hand, go through protobuf-es", () => {
    const others: AgentEvent[] = [
      create(AgentEventSchema, { sessionId: "s", seq: 1n, payload: { case: "agentStart", value: {} } }),
      create(AgentEventSchema, {
        sessionId: "s",
        seq: 2n,
        payload: {
          case: "messageUpdate",
          value: { messageId: "m", delta: { case: "toolCall", value: { index: 1, argumentsDelta: "{" } } },
        },
      }),
      // No time, a negative time, a seq past 2^53: written by protobuf-es.
      create(AgentEventSchema, {
        sessionId: "s",
        seq: 3n,
        payload: { case: "messageUpdate", value: { messageId: "m", delta: { case: "text", value: "x" } } },
      }),
      delta("text", "x", { seconds: -5n }),
      delta("text", "x", { seq: 2n ** 60n }),
    ];
    for (const event of others) assert.deepEqual(Buffer.from(attachEventBytes(event)), Buffer.from(reference(event)));
  });
});
