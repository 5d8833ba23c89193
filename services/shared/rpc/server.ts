// The server: typed handlers wrapped with error mapping and spans, one interceptor that checks
// credentials and refuses malformed requests, the health service, and the drain lifecycle.
import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";
import * as grpc from "@grpc/grpc-js";
import type { DescMethod } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { SpanKind, SpanStatusCode, context } from "@opentelemetry/api";
import { TENANT, isOpenPath, type Authenticator } from "../auth/auth.js";
import { failure, type Logger, withLogFields } from "../process/log.js";
import { RpcError, Status, toStatus } from "../errors.js";
import { instruments, secondsSince } from "../process/metrics.js";
import { extractContext, spanContext, tracer } from "../process/telemetry.js";
import { MalformedMessage, serviceDefinition } from "./definition.js";
import { channelOptions, DEFAULT_MAX_MESSAGE_BYTES } from "./limits.js";
import { type CallContext, type Responses, serveStream } from "./call-context.js";
import { Channel } from "./channel.js";
import { LiveCalls } from "./live-calls.js";
import type { ServiceImpl } from "./types.js";

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

/** A unary request's session id, for log records; a stream's first frame is not read yet. */
function sessionIdOf(call: unknown): string | undefined {
  const id = (call as { request?: { sessionId?: unknown } }).request?.sessionId;
  return typeof id === "string" && id !== "" ? id : undefined;
}

type AnyCall = grpc.ServerUnaryCall<unknown, unknown> & grpc.ServerDuplexStream<unknown, unknown>;

/** Where a handler's unexpected failure goes: a logger, or (the adapter's own tests) stderr. */
type Unexpected = (path: string, err: unknown, ctx: ReturnType<typeof context.active>) => void;

function unexpectedTo(logger: Logger | undefined): Unexpected {
  if (!logger) return (path, err) => console.error(`${path}:`, err);
  // Under the call's context, so the record carries its trace, tenant and session (log.ts).
  return (path, err, ctx) => context.with(ctx, () => logger.error(`${path} failed`, failure(err)));
}

function wrapHandler(
  method: DescMethod,
  handler: (...args: never[]) => unknown,
  unexpected: Unexpected,
): grpc.UntypedHandleCall {
  const path = `${method.parent.typeName}/${method.name}`;
  const startSpan = (call: { metadata: grpc.Metadata }) => {
    const parent = extractContext(call.metadata);
    const span = tracer.startSpan(
      path,
      { kind: SpanKind.SERVER, attributes: { "rpc.system.name": "grpc", "rpc.method": path } },
      parent,
    );
    // Log records made while serving the call say whose it is (log.ts).
    const ctx = withLogFields(spanContext(parent, span), {
      tenant: String(call.metadata.get(TENANT)[0] ?? ""),
      session_id: sessionIdOf(call),
    });
    return { span, ctx, started: performance.now() };
  };
  const endSpan = ({ span, started }: ReturnType<typeof startSpan>, code: Status) => {
    const statusName = Status[code] ?? String(code);
    span.setAttribute("rpc.status_code", statusName);
    if (SERVER_ERROR_CODES.has(code)) span.setStatus({ code: SpanStatusCode.ERROR });
    span.end();
    instruments().rpcDuration.record(secondsSince(started), {
      "rpc.system.name": "grpc",
      "rpc.method": path,
      "rpc.response.status_code": statusName,
    });
  };

  if (method.methodKind === "client_streaming") throw new Error(`${path}: client-streaming methods are not served`);
  if (method.methodKind === "unary") {
    const fn = handler as unknown as (a: unknown, b?: unknown) => Promise<unknown>;
    const unary = (call: AnyCall, callback: grpc.sendUnaryData<unknown>) => {
      const started = startSpan(call);
      context
        .with(started.ctx, () => fn(call.request, call))
        .then(
          (response) => {
            endSpan(started, Status.OK);
            callback(null, response);
          },
          (err: unknown) => {
            const status = toStatus(err);
            if (!(err instanceof RpcError) && status.code === Status.INTERNAL) unexpected(path, err, started.ctx);
            endSpan(started, status.code);
            callback(status);
          },
        );
    };
    return unary as unknown as grpc.UntypedHandleCall;
  }
  const fn = handler as unknown as (input: unknown, ctx: CallContext) => Responses<unknown>;
  const bidi = method.methodKind === "bidi_streaming";
  const streaming = (call: AnyCall) => {
    const started = startSpan(call);
    let ended = false;
    const finish = (code: Status) => {
      if (ended) return;
      ended = true;
      endSpan(started, code);
    };
    call.once("finish", () => finish(Status.OK));
    call.once("cancelled", () => finish(Status.CANCELLED));
    const failed = (err: unknown) => {
      const status = toStatus(err);
      if (!(err instanceof RpcError) && status.code === Status.INTERNAL) unexpected(path, err, started.ctx);
      finish(status.code);
    };
    context.with(started.ctx, () => serveStream(call, path, bidi, fn, failed));
  };
  return streaming as unknown as grpc.UntypedHandleCall;
}

/**
 * A handler of `method` wrapped as the server wraps every handler (span, metrics, error mapping),
 * for calls that arrive some other way than grpc-js (AttachMany's sub-streams, attach-many.ts).
 */
export function wrappedHandler(
  method: DescMethod,
  handler: (...args: never[]) => unknown,
  logger?: Logger,
): grpc.UntypedHandleCall {
  return wrapHandler(method, handler, unexpectedTo(logger));
}

export interface ServerOptions {
  /** Largest message the server accepts; larger ones fail with RESOURCE_EXHAUSTED. */
  maxMessageBytes?: number;
  /** Checks every call's credentials (auth.ts); without it the server answers anyone (tests of the adapter only). */
  authenticate?: Authenticator;
  /** Where a handler's unexpected failure (INTERNAL, not an RpcError) is logged; every service gives its own. */
  logger?: Logger;
}

/** Health states of the standard health service. */
export { HealthCheckResponse_ServingStatus as ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../gen/grpc/health/v1/health_pb.js";

export interface TlsFiles {
  certFile: string;
  keyFile: string;
}

/** How often a TLS server reads its certificate and key again. */
export const TLS_RELOAD_MS = 5000;

/** Throws, saying which file and why, unless the two files make a usable key pair. */
function checkKeyPair({ certFile, keyFile }: TlsFiles): void {
  const read = (file: string, what: string) => {
    try {
      return readFileSync(file);
    } catch (err) {
      throw new Error(`the TLS ${what} ${file} cannot be read: ${(err as NodeJS.ErrnoException).code ?? err}`);
    }
  };
  const cert = read(certFile, "certificate");
  const key = read(keyFile, "key");
  try {
    createSecureContext({ cert, key });
  } catch (err) {
    throw new Error(`${certFile} and ${keyFile} are not a certificate and its key: ${(err as Error).message}`);
  }
}

/** How long close() waits for the connections of the calls it ended to close. */
const CLOSE_WAIT_MS = 1000;

/**
 * A grpc-js server with the health service built in. Lifecycle: add services, listen(), and on
 * the way out drain(): health goes NOT_SERVING, new calls are refused, running ones get a grace
 * period; then close(), last, ends whatever is left.
 */
export class RpcServer {
  private readonly server: grpc.Server;
  private readonly statuses = new Map<string, Serving>([["", Serving.SERVING]]);
  private readonly watchers = new Map<string, Set<Channel<{ status: Serving }>>>();
  private readonly unexpected: Unexpected;
  private readonly live = new LiveCalls();

  constructor(options: ServerOptions = {}) {
    this.unexpected = unexpectedTo(options.logger);
    this.server = new grpc.Server({
      ...channelOptions(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES),
      // Lets clients re-resolve and rebalance behind a Kubernetes Service.
      "grpc.max_connection_age_ms": 30 * 60_000,
      "grpc.max_connection_age_grace_ms": 5 * 60_000,
      "grpc.keepalive_permit_without_calls": 1,
      "grpc.http2.min_ping_interval_without_data_ms": 60_000,
      // Node's 10 MB default per HTTP/2 session throttles fast event streams.
      "grpc-node.max_session_memory": 64,
      // The live-call tracker innermost, so that it sees the guard's refusals end their calls too.
      interceptors: [this.live.interceptor, guard(options.authenticate)],
    });
    this.add(Health, {
      check: async (req) => {
        const status = this.statuses.get(req.service);
        if (status === undefined) throw new RpcError(Status.NOT_FOUND, `unknown service ${req.service}`);
        return { status };
      },
      watch: (req, ctx) => {
        const updates = new Channel<{ status: Serving }>();
        let set = this.watchers.get(req.service);
        if (!set) this.watchers.set(req.service, (set = new Set()));
        const watchers = set;
        watchers.add(updates);
        updates.push({ status: this.statuses.get(req.service) ?? Serving.SERVICE_UNKNOWN });
        ctx.signal.addEventListener("abort", () => watchers.delete(updates), { once: true });
        return updates;
      },
    });
  }

  add<S extends GenServiceMethods>(service: GenService<S>, impl: ServiceImpl<S>): this {
    const handlers: grpc.UntypedServiceImplementation = {};
    for (const method of service.methods) {
      handlers[method.localName] = wrapHandler(method, impl[method.localName as keyof S] as never, this.unexpected);
    }
    this.server.addService(serviceDefinition(service), handlers);
    if (service.typeName !== Health.typeName) this.setStatus(service.typeName, Serving.SERVING);
    return this;
  }

  setStatus(service: string, status: Serving): void {
    this.statuses.set(service, status);
    for (const updates of this.watchers.get(service) ?? []) updates.push({ status });
  }

  /**
   * Serve on host:port (port 0 picks a free one). Resolves to the bound port. With `tls`, serves
   * TLS with the PEM files named, read again every TLS_RELOAD_MS so a renewed certificate is
   * served without a restart; files that do not make a key pair fail the start.
   */
  listen(address: string, tls?: TlsFiles): Promise<number> {
    let credentials = grpc.ServerCredentials.createInsecure();
    if (tls) {
      checkKeyPair(tls);
      const files = new grpc.experimental.FileWatcherCertificateProvider({
        certificateFile: tls.certFile,
        privateKeyFile: tls.keyFile,
        refreshIntervalMs: TLS_RELOAD_MS,
      });
      credentials = grpc.experimental.createCertificateProviderServerCredentials(files, null, false);
    }
    return new Promise((resolve, reject) => {
      this.server.bindAsync(address, credentials, (err, port) => {
        if (!err) return resolve(port);
        // grpc-js says "No address added out of total 1 resolved"; the reason is further on.
        if (/EADDRINUSE/.test(err.message))
          return reject(new Error(`${address} is already in use by another process (EADDRINUSE)`));
        reject(err);
      });
    });
  }

  /** Whether the server as a whole reports SERVING (false from drain on). */
  get serving(): boolean {
    return this.statuses.get("") === Serving.SERVING;
  }

  /**
   * Go NOT_SERVING, stop accepting, give running calls graceMs to end. Calls still running after
   * it stay open until close(), so that the service can finish its own shutdown first (a runner
   * releases its sessions, and its clients' retries find them free).
   */
  async drain(graceMs: number): Promise<void> {
    for (const name of this.statuses.keys()) this.setStatus(name, Serving.NOT_SERVING);
    for (const set of this.watchers.values()) for (const updates of set) updates.end();
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

  /**
   * Ends every call still running with UNAVAILABLE (live-calls.ts says why grpc-js does not), and
   * resolves once their connections have closed, so the statuses are out before the process
   * exits (at most CLOSE_WAIT_MS). Last, after drain().
   */
  async close(): Promise<void> {
    this.live.endAll("the server is shutting down; retry");
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, CLOSE_WAIT_MS);
      this.server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}
