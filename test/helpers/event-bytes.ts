// An AttachResponse's bytes carrying one text delta event, as a runner writes them: for tests of
// the streams that carry them.
import { create, toBinary } from "@bufbuild/protobuf";
import { AttachResponseSchema } from "../../services/shared/gen/troupe/v1/runner_pb.js";

/** The bytes of an AttachResponse carrying event `seq`, padded with `size` bytes of text. */
export const eventBytes = (seq: number, size = 0): Uint8Array =>
  toBinary(
    AttachResponseSchema,
    create(AttachResponseSchema, {
      kind: {
        case: "event",
        value: {
          seq: BigInt(seq),
          payload: { case: "messageUpdate", value: { delta: { case: "text", value: "x".repeat(size) } } },
        },
      },
    }),
  );
