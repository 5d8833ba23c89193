// The gateway's byte passthrough: which runner responses it decodes. needsDecoding reads the wire
// bytes by hand, so it is checked against protobuf-es's own decoding of the same bytes.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { needsDecoding } from "../../services/gateway/passthrough.js";
import { AttachResponseSchema } from "../../services/shared/gen/troupe/v1/runner_pb.js";
import { AgentEventSchema } from "../../services/shared/gen/troupe/v1/session_pb.js";

const OBSERVED = new Set(["agentStart", "agentEnd", "queueApplied"]);

/** What the gateway must look into, read from a full decode: the open answer and turn bounds. */
function oracle(bytes: Uint8Array): boolean {
  const resp = fromBinary(AttachResponseSchema, bytes);
  if (resp.kind.case === "opened") return true;
  return resp.kind.case === "event" && OBSERVED.has(resp.kind.value.payload.case ?? "");
}

/** Unknown fields of every wire type, with tags of one, two and five bytes. */
function unknownFields(): Uint8Array {
  const w = new BinaryWriter();
  w.tag(900, WireType.Varint).uint64(2n ** 63n);
  w.tag(5, WireType.Bit64).fixed64(7n);
  w.tag(2 ** 28, WireType.Bit32).fixed32(9);
  w.tag(1000, WireType.LengthDelimited).bytes(new Uint8Array(300).fill(0x80));
  return w.finish();
}

const join = (...parts: Uint8Array[]) => Buffer.concat(parts);

/** One AttachResponse per payload the event can carry, and the open answer. */
function responses(): Uint8Array[] {
  const out: Uint8Array[] = [
    toBinary(AttachResponseSchema, create(AttachResponseSchema, { kind: { case: "opened", value: { agentId: "a" } } })),
  ];
  for (const field of AgentEventSchema.oneofs[0]!.fields) {
    if (field.fieldKind !== "message") continue;
    const event = create(AgentEventSchema, {
      sessionId: "s".repeat(200),
      seq: 2n ** 40n,
      turnId: "t-1",
      time: { seconds: 1_700_000_000n, nanos: 5 },
      payload: { case: field.localName, value: create(field.message) } as never,
    });
    out.push(toBinary(AttachResponseSchema, create(AttachResponseSchema, { kind: { case: "event", value: event } })));
  }
  return out;
}

/**
 * The same response with unknown fields before and inside the event (the event's length redone),
 * and after it unless `after` is false.
 */
function withUnknown(bytes: Uint8Array, after = true): Uint8Array {
  const resp = fromBinary(AttachResponseSchema, bytes);
  if (resp.kind.case !== "event") return join(unknownFields(), bytes);
  const inner = join(unknownFields(), toBinary(AgentEventSchema, resp.kind.value), unknownFields());
  const w = new BinaryWriter();
  w.tag(2, WireType.LengthDelimited).bytes(inner);
  return join(unknownFields(), w.finish(), after ? unknownFields() : new Uint8Array(0));
}

describe("needsDecoding", () => {
  test("agrees with a full decode for every payload, unknown fields or not", () => {
    const all = responses();
    assert.ok(all.length > 15, "every payload of AgentEvent");
    let observed = 0;
    for (const bytes of all) {
      for (const b of [bytes, withUnknown(bytes)]) {
        assert.equal(
          needsDecoding(b),
          oracle(b),
          `${fromBinary(AttachResponseSchema, b).kind.case} ${Buffer.from(b).toString("hex").slice(0, 40)}`,
        );
      }
      if (oracle(bytes)) observed++;
    }
    assert.equal(observed, 4, "the open answer and three turn events are looked into");
    assert.equal(needsDecoding(new Uint8Array(0)), false, "an empty response is forwarded");
  });

  // Reading stops at the event, so a cut is checked up to its end: what follows is not read.
  test("bytes cut anywhere are looked into (and refused there) or read the same as a decode", () => {
    for (const whole of responses().map((r) => withUnknown(r, false))) {
      for (let n = 0; n < whole.length; n++) {
        const cut = whole.subarray(0, n);
        let decoded: boolean | undefined;
        try {
          decoded = oracle(cut);
        } catch {
          decoded = undefined;
        }
        const answer = needsDecoding(cut);
        if (decoded === undefined) assert.equal(answer, true, `a cut at ${n} of ${whole.length} that cannot decode`);
        else assert.equal(answer, decoded, `a cut at ${n} of ${whole.length}`);
      }
    }
  });

  test("groups and overlong varints are left to the decoder", () => {
    assert.equal(needsDecoding(Uint8Array.of((7 << 3) | WireType.StartGroup, 0)), true);
    assert.equal(needsDecoding(Uint8Array.of(0xff, 0xff, 0xff, 0xff, 0xff, 0x01)), true);
    assert.equal(needsDecoding(Uint8Array.of((3 << 3) | WireType.Varint, ...new Array(10).fill(0xff), 0x01)), true);
  });
});
