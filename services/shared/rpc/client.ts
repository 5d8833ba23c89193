// Typed clients: one function per method, with trace context in metadata, a span per call and a
// default deadline on unary calls.
import * as grpc from "@grpc/grpc-js";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { type Span, SpanKind, SpanStatusCode, context } from "@opentelemetry/api";
import { RpcError, Status } from "../errors.js";
import { injectContext, spanContext, tracer } from "../process/telemetry.js";
import { serviceDefinition } from "./definition.js";
import { channelOptions, DEFAULT_DEADLINE_MS, DEFAULT_MAX_MESSAGE_BYTES, RECEIVE_WINDOW_BYTES } from "./limits.js";
import type { CallOptions, ServiceClient } from "./types.js";

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
  /** TLS, trusting `ca` (PEM) or else the system's roots. */
  tls?: { ca?: Buffer };
  /**
   * Calls may go through the HTTP proxy that grpc_proxy, https_proxy or http_proxy names (unless
   * no_proxy lists the host), as grpc-js's clients do by default: for a client reaching a gateway
   * from elsewhere. Unset, calls go straight to the address: Troupe's services talk directly,
   * whatever proxy the environment names for outbound calls (outbound-proxy.ts).
   */
  throughProxy?: boolean;
}

/** A call's client span (`path`: Service/Method), as every call of a typed client has one. */
export function startClientSpan(path: string): Span {
  return tracer.startSpan(path, {
    kind: SpanKind.CLIENT,
    attributes: { "rpc.system.name": "grpc", "rpc.method": path },
  });
}

/** Ends a client span with the call's status code. */
export function endClientSpan(span: Span, code: number): void {
  span.setAttribute("rpc.status_code", Status[code] ?? String(code));
  if (code !== Status.OK) span.setStatus({ code: SpanStatusCode.ERROR });
  span.end();
}

/** A typed client for one service at host:port. */
export function createClient<S extends GenServiceMethods>(
  service: GenService<S>,
  address: string,
  options: ClientOptions = {},
): ServiceClient<S> {
  const Ctor = grpc.makeGenericClientConstructor(serviceDefinition(service, options.rawResponses), service.typeName);
  const channel = channelOptions(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
  channel["grpc-node.flow_control_window"] = RECEIVE_WINDOW_BYTES;
  if (options.ownConnection) channel["grpc.use_local_subchannel_pool"] = 1;
  if (!options.throughProxy) channel["grpc.enable_http_proxy"] = 0;
  const credentials = options.tls
    ? grpc.credentials.createSsl(options.tls.ca ?? null)
    : grpc.credentials.createInsecure();
  const raw = new Ctor(address, credentials, channel);
  const defaultDeadline = options.defaultDeadlineMs ?? DEFAULT_DEADLINE_MS;
  const client: Record<string, unknown> = {
    close: () => raw.close(),
    ready: (ms: number) => new Promise<boolean>((resolve) => raw.waitForReady(Date.now() + ms, (err) => resolve(!err))),
  };
  const fixedHeaders = Object.entries(options.headers ?? {});

  for (const method of service.methods) {
    const name = method.localName;
    const path = `${service.typeName}/${method.name}`;
    const fn = (raw as unknown as Record<string, (...a: unknown[]) => grpc.ClientUnaryCall>)[name].bind(raw);
    const prepare = (opts: CallOptions | undefined, unary: boolean) => {
      const span = startClientSpan(path);
      const metadata = opts?.metadata?.clone() ?? new grpc.Metadata();
      for (const [k, v] of fixedHeaders) if (!metadata.get(k).length) metadata.set(k, v);
      injectContext(spanContext(context.active(), span), metadata);
      const timeout = opts?.timeoutMs ?? (unary ? defaultDeadline : undefined);
      const callOptions: grpc.CallOptions = timeout === undefined ? {} : { deadline: Date.now() + timeout };
      // grpc-js takes the earlier of this deadline and the parent's, and cancels with the parent.
      if (opts?.parent) callOptions.parent = opts.parent;
      return { span, metadata, callOptions };
    };
    const linkSignal = (call: grpc.Call, signal?: AbortSignal) => {
      if (!signal) return;
      if (signal.aborted) return call.cancel();
      const onAbort = () => call.cancel();
      signal.addEventListener("abort", onAbort, { once: true });
      call.on("status", () => signal.removeEventListener("abort", onAbort));
    };

    switch (method.methodKind) {
      case "unary":
        client[name] = (request: unknown, opts?: CallOptions) =>
          new Promise((resolve, reject) => {
            const { span, metadata, callOptions } = prepare(opts, true);
            const call = fn(request, metadata, callOptions, (err: grpc.ServiceError | null, response: unknown) => {
              endClientSpan(span, err ? err.code : Status.OK);
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
          call.on("status", (s: grpc.StatusObject) => endClientSpan(span, s.code));
          linkSignal(call, opts?.signal);
          return call;
        };
        break;
      case "bidi_streaming":
        client[name] = (opts?: CallOptions) => {
          const { span, metadata, callOptions } = prepare(opts, false);
          const call = fn(metadata, callOptions);
          call.on("status", (s: grpc.StatusObject) => endClientSpan(span, s.code));
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
