// The shapes derived from a generated service: a server's implementation and a client, method by
// method, and the options of a call.
import type * as grpc from "@grpc/grpc-js";
import type { MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import type { GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import type { CallContext, Responses } from "./call-context.js";

export type Method = GenServiceMethods[string];
export type In<M extends Method> = MessageShape<M["input"]>;
export type Out<M extends Method> = MessageShape<M["output"]>;
export type OutInit<M extends Method> = MessageInitShape<M["output"]>;
export type InInit<M extends Method> = MessageInitShape<M["input"]>;

/**
 * Server side: what a service implementation provides, method by method. Unary handlers are async
 * functions of the request; streaming ones take the request (or an async iterable of them) and a
 * CallContext, and return their responses as an async iterable (call-context.ts). Troupe has no
 * client-streaming method.
 */
export type ServiceImpl<S extends GenServiceMethods> = {
  [K in keyof S]: S[K]["methodKind"] extends "unary"
    ? (request: In<S[K]>, call: grpc.ServerUnaryCall<In<S[K]>, Out<S[K]>>) => Promise<OutInit<S[K]>>
    : S[K]["methodKind"] extends "server_streaming"
      ? (request: In<S[K]>, ctx: CallContext) => Responses<OutInit<S[K]>>
      : S[K]["methodKind"] extends "client_streaming"
        ? never
        : (requests: AsyncIterable<In<S[K]>>, ctx: CallContext) => Responses<OutInit<S[K]>>;
};

export interface CallOptions {
  /** Milliseconds from now. Unary calls default to DEFAULT_DEADLINE_MS; streams have none. */
  timeoutMs?: number;
  signal?: AbortSignal;
  metadata?: grpc.Metadata;
  /**
   * The call being served that this call is made for: its deadline bounds this one (and its
   * cancellation cancels it), as gRPC's deadline propagation has it.
   */
  parent?: grpc.CallOptions["parent"];
}

/** Client side: one function per method. */
export type ServiceClient<S extends GenServiceMethods> = {
  [K in keyof S]: S[K]["methodKind"] extends "unary"
    ? (request: InInit<S[K]>, options?: CallOptions) => Promise<Out<S[K]>>
    : S[K]["methodKind"] extends "server_streaming"
      ? (request: InInit<S[K]>, options?: CallOptions) => grpc.ClientReadableStream<Out<S[K]>>
      : S[K]["methodKind"] extends "client_streaming"
        ? (options?: CallOptions) => Promise<never>
        : (options?: CallOptions) => grpc.ClientDuplexStream<InInit<S[K]>, Out<S[K]>>;
} & {
  readonly close: () => void;
  /**
   * Resolves true once the channel is connected, false after `ms` without: waits out grpc-js's
   * reconnect backoff to a peer that restarted, where a call would fail at once.
   */
  readonly ready: (ms: number) => Promise<boolean>;
};
