// The one bridge between protobuf-es service descriptors and grpc-js. Every Troupe service and
// client is built from the generated descriptors through this module: there is no per-method
// plumbing and no second copy of the schema (no proto-loader at run time).
//
// What it adds on top of grpc-js:
// - typed handlers and clients derived from the descriptor (unary handlers are async functions);
// - bytes that do not parse as the request type fail with INVALID_ARGUMENT, not INTERNAL;
// - RpcError thrown by a handler becomes that status; anything else becomes INTERNAL;
// - W3C trace context travels in metadata on every call, with one span per RPC;
// - explicit message-size limits, keepalive and deadlines on both ends.
//
// One concern per file under rpc/; this module only re-exports them.
import * as grpc from "@grpc/grpc-js";

export { grpc };
export { serviceDefinition } from "./rpc/definition.js";
export type { CallOptions, ServiceClient, ServiceImpl } from "./rpc/types.js";
export { DEFAULT_DEADLINE_MS, DEFAULT_MAX_MESSAGE_BYTES, RECONNECT_WAIT_MS } from "./rpc/limits.js";
export { RpcServer, ServingStatus, type ServerOptions, wrappedHandler } from "./rpc/server.js";
export { createClient, type ClientOptions } from "./rpc/client.js";
export { routeGrpcLogs } from "./rpc/logging.js";
