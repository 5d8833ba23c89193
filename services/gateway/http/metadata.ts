// What of an HTTP request's headers reaches the gateway's gRPC server as call metadata:
// credentials and trace context, nothing else.
import type http from "node:http";
import { grpc } from "../../shared/rpc.js";

const FORWARDED = ["authorization", "traceparent", "tracestate"];

/** Metadata for the gRPC call from an HTTP request's headers. */
export function forwardedMetadata(headers: Headers | http.IncomingHttpHeaders): grpc.Metadata {
  const metadata = new grpc.Metadata();
  for (const name of FORWARDED) {
    const value = headers instanceof Headers ? headers.get(name) : headers[name];
    if (typeof value === "string" && value !== "") metadata.set(name, value);
  }
  return metadata;
}
