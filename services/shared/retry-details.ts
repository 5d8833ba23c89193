// How a refusal that may succeed later says when, in every form a client reads: Troupe's own
// `retry-after-ms` trailer; `grpc-retry-pushback-ms`, which grpc-js's and grpc-go's retry
// policies wait for (gRPC's retry design, A6); and google.rpc.Status details in
// `grpc-status-details-bin` (RetryInfo, and ErrorInfo with a stable reason), which grpc-go's
// status.Details and Google's client libraries decode.
import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack, DurationSchema } from "@bufbuild/protobuf/wkt";
import type { Metadata } from "@grpc/grpc-js";
import { ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "./gen/google/rpc/status_pb.js";

export const PUSHBACK_TRAILER = "grpc-retry-pushback-ms";
export const STATUS_DETAILS_TRAILER = "grpc-status-details-bin";
/** The domain of Troupe's ErrorInfo reasons. */
export const ERROR_DOMAIN = "troupe.v1";

/** Adds the pushback and the status details for a wait of `ms` to `metadata`. */
export function addRetryDetails(metadata: Metadata, code: number, message: string, ms: number, reason: string): void {
  metadata.set(PUSHBACK_TRAILER, String(ms));
  const status = create(StatusSchema, {
    code,
    message,
    details: [
      anyPack(
        RetryInfoSchema,
        create(RetryInfoSchema, {
          retryDelay: create(DurationSchema, {
            seconds: BigInt(Math.floor(ms / 1000)),
            nanos: (ms % 1000) * 1_000_000,
          }),
        }),
      ),
      anyPack(
        ErrorInfoSchema,
        create(ErrorInfoSchema, { reason, domain: ERROR_DOMAIN, metadata: { retry_after_ms: String(ms) } }),
      ),
    ],
  });
  metadata.set(STATUS_DETAILS_TRAILER, Buffer.from(toBinary(StatusSchema, status)));
}

/** Adds google.rpc.Status details with one ErrorInfo (a refusal's stable reason) to `metadata`. */
export function addErrorInfo(metadata: Metadata, code: number, message: string, reason: string, domain: string): void {
  const status = create(StatusSchema, {
    code,
    message,
    details: [anyPack(ErrorInfoSchema, create(ErrorInfoSchema, { reason, domain }))],
  });
  metadata.set(STATUS_DETAILS_TRAILER, Buffer.from(toBinary(StatusSchema, status)));
}
