// bench/passthrough: what the gateway spends deciding whether to decode a runner's response. Every
// token a client receives passes needsDecoding once; the baseline, in the same run, is decoding
// the same bytes with protobuf-es (what the gateway would do per token without the passthrough).
// In-process, one token event (a MessageUpdate with a few characters of text) as the runner sends.
//
//   node dist/bench/passthrough.js [--calls 2000000]
import { parseArgs } from "node:util";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { needsDecoding } from "../services/gateway/passthrough.js";
import { AttachResponseSchema } from "../services/shared/gen/troupe/v1/runner_pb.js";

const { values } = parseArgs({ options: { calls: { type: "string", default: "2000000" } } });
const N = Number(values.calls);
const token = Buffer.from(
  toBinary(
    AttachResponseSchema,
    create(AttachResponseSchema, {
      kind: {
        case: "event",
        value: {
          sessionId: "3f2c1a7e-5b0d-4c8e-9a61-2d7f0b4e8c13",
          seq: 4321n,
          turnId: "c0a4e6b2-1f3d-4e5a-8b7c-9d0e1f2a3b4c",
          time: { seconds: 1_764_000_000n, nanos: 123_456_789 },
          payload: { case: "messageUpdate", value: { messageId: "m-17", delta: { case: "text", value: " token" } } },
        },
      },
    }),
  ),
);

/** Nanoseconds per call of f over N calls (the best of three rounds, after one to warm up). */
function nsPerCall(f: (b: Uint8Array) => boolean): number {
  let best = Number.POSITIVE_INFINITY;
  let sink = 0;
  for (let round = 0; round < 4; round++) {
    const t = process.hrtime.bigint();
    for (let i = 0; i < N; i++) if (f(token)) sink++;
    const ns = Number(process.hrtime.bigint() - t) / N;
    if (round > 0) best = Math.min(best, ns);
  }
  if (sink !== 0 && sink !== 4 * N) throw new Error("the answer changed between calls");
  return best;
}

if (needsDecoding(token)) throw new Error("a token event must be forwarded undecoded");
const scan = nsPerCall(needsDecoding);
const decode = nsPerCall((b) => fromBinary(AttachResponseSchema, b).kind.case === "opened");
console.log(
  `${token.length}-byte token event: needsDecoding ${scan.toFixed(1)} ns; fromBinary ${decode.toFixed(1)} ns`,
);
console.log(
  `RESULT scan_ns=${scan.toFixed(1)} baseline_decode_ns=${decode.toFixed(1)} ratio=${(decode / scan).toFixed(1)}`,
);
