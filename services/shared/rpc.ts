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
import * as grpc from "@grpc/grpc-js";
import {
  create,
  fromBinary,
  isMessage,
  toBinary,
  type DescMessage,
  type DescMethod,
  type DescService,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { SpanKind, SpanStatusCode, context, trace, type Context } from "@opentelemetry/api";
import { isOpenPath, type Authenticator } from "./auth.js";
import { RpcError, Status, toStatus } from "./errors.js";
import { extractContext, injectContext, tracer } from "./telemetry.js";

export { grpc };

/** What a request that failed to parse turns into; the server rejects it before any handler sees it. */
class MalformedMessage {
  constructor(readonly reason: string) {}
}

const asBuffer = (bytes: Uint8Array): Buffer => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);

/** Messages may also be written as bytes already encoded (a proxy forwarding what it received). */
function serialize<D extends DescMessage>(schema: D) {
  return (msg: MessageShape<D> | MessageInitShape<D> | Uint8Array): Buffer =>
    msg instanceof Uint8Array
      ? asBuffer(msg)
      : asBuffer(toBinary(schema, isMessage(msg, schema) ? msg : create(schema, msg as MessageInitShape<D>)));
}

const passBytes = (bytes: Buffer) => bytes;

function methodDefinition(method: DescMethod, rawResponse = false): grpc.MethodDefinition<unknown, unknown> {
  const { input, output, methodKind } = method;
  return {
    path: `/${method.parent.typeName}/${method.name}`,
    requestStream: methodKind === "client_streaming" || methodKind === "bidi_streaming",
    responseStream: methodKind === "server_streaming" || methodKind === "bidi_streaming",
    requestSerialize: serialize(input) as (m: unknown) => Buffer,
    requestDeserialize: (bytes: Buffer) => {
      try {
        return fromBinary(input, bytes);
      } catch (err) {
        return new MalformedMessage(`malformed ${input.typeName}: ${(err as Error).message}`);
      }
    },
    responseSerialize: serialize(output) as (m: unknown) => Buffer,
    responseDeserialize: rawResponse ? passBytes : (bytes: Buffer) => fromBinary(output, bytes),
    originalName: method.localName,
  };
}

/**
 * The grpc-js service definition of a protobuf-es service descriptor. Methods named in
 * rawResponses hand their responses to the caller as the received bytes, undecoded.
 */
export function serviceDefinition(service: DescService, rawResponses: readonly string[] = []): grpc.ServiceDefinition {
  const def: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const method of service.methods)
    def[method.localName] = methodDefinition(method, rawResponses.includes(method.localName));
  return def as grpc.ServiceDefinition;
}

// ---------------------------------------------------------------------------------------------
// Types derived from a generated service

type Method = GenServiceMethods[string];
type In<M extends Method> = MessageShape<M["input"]>;
type Out<M extends Method> = MessageShape<M["output"]>;
type OutInit<M extends Method> = MessageInitShape<M["output"]>;
type InInit<M extends Method> = MessageInitShape<M["input"]>;

/** Server side: what a service implementation provides, method by method. */
export type ServiceImpl<S extends GenServiceMethods> = {
  [K in keyof S]: S[K]["methodKind"] extends "unary"
    ? (request: In<S[K]>, call: grpc.ServerUnaryCall<In<S[K]>, Out<S[K]>>) => Promise<OutInit<S[K]>>
    : S[K]["methodKind"] extends "server_streaming"
      ? (call: grpc.ServerWritableStream<In<S[K]>, Out<S[K]>>) => void | Promise<void>
      : S[K]["methodKind"] extends "client_streaming"
        ? (call: grpc.ServerReadableStream<In<S[K]>, Out<S[K]>>) => Promise<OutInit<S[K]>>
        : (call: grpc.ServerDuplexStream<In<S[K]>, Out<S[K]>>) => void | Promise<void>;
};

export interface CallOptions {
  /** Milliseconds from now. Unary calls default to DEFAULT_DEADLINE_MS; streams have none. */
  timeoutMs?: number;
  signal?: AbortSignal;
  metadata?: grpc.Metadata;
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
} & { readonly close: () => void };

// ---------------------------------------------------------------------------------------------
// Limits shared by servers and clients (explicit, so other stacks can match them)

export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
export const DEFAULT_DEADLINE_MS = 10_000;

function channelOptions(maxMessageBytes: number): grpc.ChannelOptions {
  return {
    "grpc.max_receive_message_length": maxMessageBytes,
    "grpc.max_send_message_length": maxMessageBytes,
    // Pings no more often than other gRPC stacks accept by default (5 min).
    "grpc.keepalive_time_ms": 300_000,
    "grpc.keepalive_timeout_ms": 20_000,
    "grpc.enable_channelz": 0,
  };
}

// ---------------------------------------------------------------------------------------------
// Server

/**
 * The one interceptor every server runs (one layer, so each call pays for one): the server's
 * authenticator on the call's metadata, then requests that did not parse are refused with
 * INVALID_ARGUMENT, both before any handler runs. A refused call ends with its status. The
 * health and reflection services need no credentials.
 */
function guard(authenticate: Authenticator | undefined): grpc.ServerInterceptor {
  return (method, call) => {
    const open = authenticate === undefined || isOpenPath(method.path);
    const intercepting: grpc.ServerInterceptingCall = new grpc.ServerInterceptingCall(call, {
      start: (next) =>
        next({
          onReceiveMetadata: (metadata, forward) => {
            if (!open) {
              try {
                authenticate(metadata, method.path);
              } catch (err) {
                const status = toStatus(err);
                intercepting.sendStatus({
                  code: status.code,
                  details: status.details,
                  metadata: status.metadata ?? new grpc.Metadata(),
                });
                return;
              }
            }
            forward(metadata);
          },
          onReceiveMessage: (message, forward) => {
            if (message instanceof MalformedMessage) {
              intercepting.sendStatus({ code: Status.INVALID_ARGUMENT, details: message.reason });
              return;
            }
            forward(message);
          },
        }),
    });
    return intercepting;
  };
}

// Server spans are errors only for the codes that mean the server failed (OTel RPC conventions).
const SERVER_ERROR_CODES = new Set([
  Status.UNKNOWN,
  Status.DEADLINE_EXCEEDED,
  Status.UNIMPLEMENTED,
  Status.INTERNAL,
  Status.UNAVAILABLE,
  Status.DATA_LOSS,
]);

type AnyCall = grpc.ServerUnaryCall<unknown, unknown> & grpc.ServerDuplexStream<unknown, unknown>;

function wrapHandler(method: DescMethod, handler: (...args: never[]) => unknown): grpc.UntypedHandleCall {
  const path = `${method.parent.typeName}/${method.name}`;
  const startSpan = (call: { metadata: grpc.Metadata }) => {
    const parent = extractContext(call.metadata);
    const span = tracer.startSpan(
      path,
      { kind: SpanKind.SERVER, attributes: { "rpc.system.name": "grpc", "rpc.method": path } },
      parent,
    );
    return { span, ctx: spanContext(parent, span) };
  };
  const endSpan = (span: ReturnType<typeof startSpan>["span"], code: Status) => {
    span.setAttribute("rpc.status_code", Status[code] ?? String(code));
    if (SERVER_ERROR_CODES.has(code)) span.setStatus({ code: SpanStatusCode.ERROR });
    span.end();
  };

  if (method.methodKind === "unary" || method.methodKind === "client_streaming") {
    const fn = handler as unknown as (a: unknown, b?: unknown) => Promise<unknown>;
    const unary = (call: AnyCall, callback: grpc.sendUnaryData<unknown>) => {
      const { span, ctx } = startSpan(call);
      const run = method.methodKind === "unary" ? () => fn(call.request, call) : () => fn(call);
      context.with(ctx, run).then(
        (response) => {
          endSpan(span, Status.OK);
          callback(null, response);
        },
        (err: unknown) => {
          const status = toStatus(err);
          if (!(err instanceof RpcError) && status.code === Status.INTERNAL) console.error(`${path}:`, err);
          endSpan(span, status.code);
          callback(status);
        },
      );
    };
    return unary as unknown as grpc.UntypedHandleCall;
  }
  const fn = handler as unknown as (call: AnyCall) => unknown;
  const streaming = (call: AnyCall) => {
    const { span, ctx } = startSpan(call);
    let ended = false;
    const finish = (code: Status) => {
      if (ended) return;
      ended = true;
      endSpan(span, code);
    };
    call.once("finish", () => finish(Status.OK));
    call.once("cancelled", () => finish(Status.CANCELLED));
    try {
      const result = context.with(ctx, () => fn(call));
      if (result instanceof Promise) result.catch((err: unknown) => failStream(call, err, path, finish));
    } catch (err) {
      failStream(call, err, path, finish);
    }
  };
  return streaming as unknown as grpc.UntypedHandleCall;
}

function failStream(call: AnyCall, err: unknown, path: string, finish: (code: Status) => void): void {
  const status = toStatus(err);
  if (!(err instanceof RpcError) && status.code === Status.INTERNAL) console.error(`${path}:`, err);
  finish(status.code);
  if (!call.cancelled && !call.writableEnded) call.emit("error", status);
}

const spanContext = (parent: Context, span: ReturnType<typeof tracer.startSpan>): Context =>
  trace.setSpan(parent, span);

export interface ServerOptions {
  /** Largest message the server accepts; larger ones fail with RESOURCE_EXHAUSTED. */
  maxMessageBytes?: number;
  /** Checks every call's credentials (auth.ts); without it the server answers anyone (tests of the adapter only). */
  authenticate?: Authenticator;
}

/** Health states of the standard health service. */
export { HealthCheckResponse_ServingStatus as ServingStatus } from "./gen/grpc/health/v1/health_pb.js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "./gen/grpc/health/v1/health_pb.js";

/**
 * A grpc-js server with the health service built in. Lifecycle: add services, listen(), and on
 * the way out drain(): health goes NOT_SERVING, new calls are refused, running ones get a grace
 * period, then whatever is left is cancelled.
 */
export class RpcServer {
  private readonly server: grpc.Server;
  private readonly statuses = new Map<string, Serving>([["", Serving.SERVING]]);
  private readonly watchers = new Map<string, Set<grpc.ServerWritableStream<unknown, unknown>>>();

  constructor(options: ServerOptions = {}) {
    this.server = new grpc.Server({
      ...channelOptions(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES),
      // Lets clients re-resolve and rebalance behind a Kubernetes Service.
      "grpc.max_connection_age_ms": 30 * 60_000,
      "grpc.max_connection_age_grace_ms": 5 * 60_000,
      "grpc.keepalive_permit_without_calls": 1,
      "grpc.http2.min_ping_interval_without_data_ms": 60_000,
      // Node's 10 MB default per HTTP/2 session throttles fast event streams.
      "grpc-node.max_session_memory": 64,
      interceptors: [guard(options.authenticate)],
    });
    this.add(Health, {
      check: async (req) => {
        const status = this.statuses.get(req.service);
        if (status === undefined) throw new RpcError(Status.NOT_FOUND, `unknown service ${req.service}`);
        return { status };
      },
      watch: (call) => {
        const name = call.request.service;
        let set = this.watchers.get(name);
        if (!set) this.watchers.set(name, (set = new Set()));
        set.add(call as never);
        call.write({ status: this.statuses.get(name) ?? Serving.SERVICE_UNKNOWN } as never);
        call.on("cancelled", () => set.delete(call as never));
      },
    });
  }

  add<S extends GenServiceMethods>(service: GenService<S>, impl: ServiceImpl<S>): this {
    const handlers: grpc.UntypedServiceImplementation = {};
    for (const method of service.methods) {
      handlers[method.localName] = wrapHandler(method, impl[method.localName as keyof S] as never);
    }
    this.server.addService(serviceDefinition(service), handlers);
    if (service.typeName !== Health.typeName) this.setStatus(service.typeName, Serving.SERVING);
    return this;
  }

  setStatus(service: string, status: Serving): void {
    this.statuses.set(service, status);
    for (const call of this.watchers.get(service) ?? []) call.write({ status } as never);
  }

  /** Serve on host:port (port 0 picks a free one). Resolves to the bound port. */
  listen(address: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err, port) =>
        err ? reject(err) : resolve(port),
      );
    });
  }

  /** Go NOT_SERVING, stop accepting, give running calls graceMs to end, then cancel the rest. */
  async drain(graceMs: number): Promise<void> {
    for (const name of this.statuses.keys()) this.setStatus(name, Serving.NOT_SERVING);
    for (const set of this.watchers.values()) for (const call of set) call.end();
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.server.forceShutdown();
        resolve();
      }, graceMs);
      this.server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Client

export interface ClientOptions {
  maxMessageBytes?: number;
  /**
   * Streaming methods whose responses arrive as undecoded bytes (typed as the message, so the
   * caller must cast). For proxies that forward what they receive.
   */
  rawResponses?: readonly string[];
  /** Deadline for unary calls that set none. */
  defaultDeadlineMs?: number;
  /**
   * A connection of its own, not shared with other clients of the same address (grpc-js shares
   * them process-wide by default). For a process that must look like several clients.
   */
  ownConnection?: boolean;
  /** Metadata sent with every call: credentials (auth.ts). */
  headers?: Record<string, string>;
}

/** A typed client for one service at host:port. */
export function createClient<S extends GenServiceMethods>(
  service: GenService<S>,
  address: string,
  options: ClientOptions = {},
): ServiceClient<S> {
  const Ctor = grpc.makeGenericClientConstructor(serviceDefinition(service, options.rawResponses), service.typeName);
  const channel = channelOptions(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
  if (options.ownConnection) channel["grpc.use_local_subchannel_pool"] = 1;
  const raw = new Ctor(address, grpc.credentials.createInsecure(), channel);
  const defaultDeadline = options.defaultDeadlineMs ?? DEFAULT_DEADLINE_MS;
  const client: Record<string, unknown> = { close: () => raw.close() };
  const fixedHeaders = Object.entries(options.headers ?? {});

  for (const method of service.methods) {
    const name = method.localName;
    const path = `${service.typeName}/${method.name}`;
    const fn = (raw as unknown as Record<string, (...a: unknown[]) => grpc.ClientUnaryCall>)[name].bind(raw);
    const prepare = (opts: CallOptions | undefined, unary: boolean) => {
      const span = tracer.startSpan(path, {
        kind: SpanKind.CLIENT,
        attributes: { "rpc.system.name": "grpc", "rpc.method": path },
      });
      const metadata = opts?.metadata?.clone() ?? new grpc.Metadata();
      for (const [k, v] of fixedHeaders) if (!metadata.get(k).length) metadata.set(k, v);
      injectContext(spanContext(context.active(), span), metadata);
      const timeout = opts?.timeoutMs ?? (unary ? defaultDeadline : undefined);
      const callOptions: grpc.CallOptions = timeout === undefined ? {} : { deadline: Date.now() + timeout };
      return { span, metadata, callOptions };
    };
    const linkSignal = (call: grpc.Call, signal?: AbortSignal) => {
      if (!signal) return;
      if (signal.aborted) return call.cancel();
      const onAbort = () => call.cancel();
      signal.addEventListener("abort", onAbort, { once: true });
      call.on("status", () => signal.removeEventListener("abort", onAbort));
    };
    const endSpan = (span: ReturnType<typeof tracer.startSpan>, code: number) => {
      span.setAttribute("rpc.status_code", Status[code] ?? String(code));
      if (code !== Status.OK) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
    };

    switch (method.methodKind) {
      case "unary":
        client[name] = (request: unknown, opts?: CallOptions) =>
          new Promise((resolve, reject) => {
            const { span, metadata, callOptions } = prepare(opts, true);
            const call = fn(request, metadata, callOptions, (err: grpc.ServiceError | null, response: unknown) => {
              endSpan(span, err ? err.code : Status.OK);
              if (err) reject(err);
              else resolve(response);
            });
            linkSignal(call, opts?.signal);
          });
        break;
      case "server_streaming":
        client[name] = (request: unknown, opts?: CallOptions) => {
          const { span, metadata, callOptions } = prepare(opts, false);
          const call = fn(request, metadata, callOptions);
          call.on("status", (s: grpc.StatusObject) => endSpan(span, s.code));
          linkSignal(call, opts?.signal);
          return call;
        };
        break;
      case "bidi_streaming":
        client[name] = (opts?: CallOptions) => {
          const { span, metadata, callOptions } = prepare(opts, false);
          const call = fn(metadata, callOptions);
          call.on("status", (s: grpc.StatusObject) => endSpan(span, s.code));
          linkSignal(call, opts?.signal);
          return call;
        };
        break;
      default:
        client[name] = () =>
          Promise.reject(new RpcError(Status.UNIMPLEMENTED, `${path}: client streaming is not used by Troupe`));
    }
  }
  return client as ServiceClient<S>;
}

// ---------------------------------------------------------------------------------------------
// Streams

/**
 * Write one message honouring backpressure: resolves at once while the stream has room, and
 * after 'drain' once grpc-js reports its buffer full. Rejects if the stream closes first.
 */
export function write<T>(
  stream: {
    write(msg: T): boolean;
    once(ev: string, fn: (...a: unknown[]) => void): unknown;
    removeListener(ev: string, fn: (...a: unknown[]) => void): unknown;
  },
  msg: T,
): Promise<void> | undefined {
  if (stream.write(msg)) return undefined;
  return new Promise((resolve, reject) => {
    const onDrain = () => {
      cleanup();
      resolve();
    };
    const onClose = () => {
      cleanup();
      reject(new RpcError(Status.CANCELLED, "stream closed"));
    };
    const cleanup = () => {
      stream.removeListener("drain", onDrain);
      stream.removeListener("close", onClose);
      stream.removeListener("cancelled", onClose);
      stream.removeListener("error", onClose);
    };
    stream.once("drain", onDrain);
    stream.once("close", onClose);
    stream.once("cancelled", onClose);
    stream.once("error", onClose);
  });
}
