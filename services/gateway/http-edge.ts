// The gateway's HTTP face, on TROUPE_HTTP_ADDR: every unary and server-streaming GatewayService
// and AdminService method through the Connect protocol (JSON or binary, HTTP/1.1 or HTTP/2) and gRPC-Web, so that
// curl, a browser or a webhook can drive a session; and the OpenAI-compatible /v1 (openai-compat.ts).
// Bidirectional Chat stays on gRPC: HTTP clients use SendMessage, Steer, FollowUp and Abort with
// Subscribe.
//
// Each call is handed to the gateway's own gRPC server over a private Unix socket, so API keys,
// rate limits, quotas and statuses are the gRPC API's by construction, never a second copy of
// them. Connect's codes are gRPC's, so a status maps one to one (PERMISSION_DENIED is HTTP 403,
// UNAUTHENTICATED 401, RESOURCE_EXHAUSTED 429, as Connect's protocol says).
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter, type ConnectNodeAdapterOptions } from "@connectrpc/connect-node";
import { context } from "@opentelemetry/api";
import type { DescService } from "@bufbuild/protobuf";
import { AdminService } from "../shared/gen/troupe/v1/admin_pb.js";
import { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { Authenticator } from "../shared/auth.js";
import { toStatus } from "../shared/errors.js";
import { splitHostPort } from "../shared/host-port.js";
import { failure, type Logger } from "../shared/log.js";
import { grpc, type ServiceClient } from "../shared/rpc.js";
import { extractContext } from "../shared/telemetry.js";
import { refuseCall } from "./connect-refusal.js";

export type GatewayClient = ServiceClient<(typeof GatewayService)["method"]>;
export type AdminClient = ServiceClient<(typeof AdminService)["method"]>;

type NodeHandler = NonNullable<ConnectNodeAdapterOptions["fallback"]>;
export type NodeServerRequest = Parameters<NodeHandler>[0];
export type NodeServerResponse = Parameters<NodeHandler>[1];

/** Headers passed on to the gRPC server as metadata: credentials and trace context. */
const FORWARDED = ["authorization", "traceparent", "tracestate"];

export interface HttpEdgeOptions {
  /** host:port to listen on. */
  address: string;
  /** The gateway's gRPC server, reached over its private socket. */
  gateway: GatewayClient;
  admin: AdminClient;
  maxMessageBytes: number;
  /** Origins allowed to call from a browser; "*" for any. */
  cors: string[];
  tls?: { certFile: string; keyFile: string };
  /**
   * The gRPC server's own check of a call's credentials, made here too before a Connect or
   * gRPC-Web request's body is read: as on the gRPC port, a caller without a valid key is told
   * so, not what else is wrong with its request, and costs no decoding.
   */
  authenticate?: Authenticator;
  /** Requests the Connect routes do not take (the OpenAI-compatible endpoint); false: not its. */
  fallback?: (req: NodeServerRequest, res: NodeServerResponse) => Promise<boolean>;
  logger: Logger;
}

export interface HttpEdge {
  port: number;
  /** Stops accepting; open streams end within graceMs. */
  close(graceMs: number): Promise<void>;
}

/** Metadata for the gRPC call from an HTTP request's headers. */
export function forwardedMetadata(headers: Headers | http.IncomingHttpHeaders): grpc.Metadata {
  const metadata = new grpc.Metadata();
  for (const name of FORWARDED) {
    const value = headers instanceof Headers ? headers.get(name) : headers[name];
    if (typeof value === "string" && value !== "") metadata.set(name, value);
  }
  return metadata;
}

/** A gRPC client's failure as Connect's: the same code, the same message. */
export function connectErrorOf(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  const e = err as { code?: number; details?: string; message?: string };
  const code = typeof e.code === "number" && e.code > 0 && e.code <= 16 ? (e.code as Code) : Code.Internal;
  return new ConnectError(e.details || e.message || "internal error", code);
}

/** Each unary and server-streaming method of both services, passed through to the gRPC server. */
function routes(gateway: GatewayClient, admin: AdminClient) {
  return (router: ConnectRouter) =>
    router
      .service(GatewayService, passThrough(GatewayService, gateway))
      .service(AdminService, passThrough(AdminService, admin));
}

function passThrough(service: DescService, client: object) {
  const impl: Record<string, unknown> = {};
  const optionsOf = (ctx: HandlerContext) => {
    const metadata = forwardedMetadata(ctx.requestHeader);
    const timeoutMs = ctx.timeoutMs();
    return { metadata, signal: ctx.signal, timeoutMs, parent: extractContext(metadata) };
  };
  for (const method of service.methods) {
    const call = (client as unknown as Record<string, (req: unknown, opts: unknown) => unknown>)[method.localName];
    if (method.methodKind === "unary")
      impl[method.localName] = async (req: unknown, ctx: HandlerContext) => {
        const { parent, ...opts } = optionsOf(ctx);
        try {
          return await context.with(parent, () => call(req, opts) as Promise<unknown>);
        } catch (err) {
          throw connectErrorOf(err);
        }
      };
    else if (method.methodKind === "server_streaming")
      impl[method.localName] = async function* (req: unknown, ctx: HandlerContext) {
        const { parent, ...opts } = optionsOf(ctx);
        const stream = context.with(parent, () => call(req, opts) as AsyncIterable<unknown>);
        try {
          for await (const message of stream) yield message;
        } catch (err) {
          throw connectErrorOf(err);
        }
      };
  }
  return impl;
}

/** The Connect routes' paths: the two services' methods, as the gRPC port names them. */
const ROUTE = /^\/troupe\.v1\.(GatewayService|AdminService)\//;

/** Answers a call to a Connect route whose credentials `authenticate` refuses. True when it did. */
function refusedCredentials(req: NodeServerRequest, res: NodeServerResponse, authenticate: Authenticator): boolean {
  const pathname = (req.url ?? "").split("?")[0];
  if (!ROUTE.test(pathname)) return false;
  try {
    // A copy: the check rewrites what it is given, and the call builds its own (passThrough).
    authenticate(forwardedMetadata(req.headers), pathname);
    return false;
  } catch (err) {
    const { code, details } = toStatus(err);
    refuseCall(req, res, code, details);
    return true;
  }
}

/** A whole answer; the HTTP/1 and HTTP/2 compatibility responses take the same calls. */
export function answer(
  res: NodeServerResponse,
  status: number,
  headers: http.OutgoingHttpHeaders,
  body: string | Buffer = "",
): void {
  (res as http.ServerResponse).writeHead(status, headers).end(body);
}

/** CORS for the allowed origins; answers preflights. True when the request is done. */
function cors(allowed: string[], req: NodeServerRequest, res: NodeServerResponse): boolean {
  const origin = req.headers.origin;
  if (typeof origin !== "string" || !(allowed.includes("*") || allowed.includes(origin))) {
    if (req.method !== "OPTIONS") return false;
    answer(res, 403, {});
    return true;
  }
  res.setHeader("access-control-allow-origin", origin);
  res.setHeader("vary", "origin");
  res.setHeader(
    "access-control-expose-headers",
    "grpc-status, grpc-message, grpc-status-details-bin, connect-content-encoding, connect-accept-encoding",
  );
  if (req.method !== "OPTIONS") return false;
  answer(res, 204, {
    "access-control-allow-methods": "POST, GET",
    "access-control-allow-headers":
      "authorization, content-type, connect-protocol-version, connect-timeout-ms, x-grpc-web, x-user-agent, grpc-timeout, traceparent, tracestate, x-troupe-session",
    "access-control-max-age": "7200",
  });
  return true;
}

export async function startHttpEdge(opts: HttpEdgeOptions): Promise<HttpEdge> {
  const connect = connectNodeAdapter({
    routes: routes(opts.gateway, opts.admin),
    // The gRPC port serves gRPC; this one, Connect and gRPC-Web (what browsers can speak).
    grpc: false,
    readMaxBytes: opts.maxMessageBytes,
    writeMaxBytes: opts.maxMessageBytes,
    fallback: (req, res) => {
      if (req.url === "/healthz") return answer(res, 200, { "content-type": "text/plain" }, "ok\n");
      // The routes behind this one read the target as a URL; one that is not (`GET http://[`)
      // is the client's error, answered here, before any of them can throw on it.
      if (!URL.canParse(req.url ?? "", "http://troupe"))
        return answer(res, 400, { "content-type": "text/plain" }, "the request target is not a URL\n");
      void (opts.fallback?.(req, res) ?? Promise.resolve(false)).then(
        (done) => {
          if (!done) answer(res, 404, { "content-type": "text/plain" }, "not found\n");
        },
        // A route's failure ends its own request, never the process with every tenant's streams.
        (err: unknown) => {
          opts.logger.error("an HTTP route failed", { url: String(req.url).slice(0, 200), ...failure(err) });
          if (res.headersSent) res.destroy();
          else answer(res, 500, { "content-type": "text/plain" }, "internal error\n");
        },
      );
    },
  });
  const handle = (req: NodeServerRequest, res: NodeServerResponse) => {
    if (opts.cors.length > 0 && cors(opts.cors, req, res)) return;
    if (opts.authenticate && refusedCredentials(req, res, opts.authenticate)) return;
    connect(req, res);
  };

  // TLS: HTTP/2 or HTTP/1.1 by ALPN, the certificate read again when its file changes. Plain:
  // HTTP/1.1, and HTTP/2 with prior knowledge, told apart by the connection's first bytes.
  let server: net.Server;
  let reload: (() => void) | undefined;
  let closeIdle: (() => void) | undefined;
  if (opts.tls) {
    const files = opts.tls;
    const secure = http2.createSecureServer(
      { cert: readFileSync(files.certFile), key: readFileSync(files.keyFile), allowHTTP1: true },
      handle,
    );
    reload = () => {
      try {
        secure.setSecureContext({ cert: readFileSync(files.certFile), key: readFileSync(files.keyFile) });
      } catch (err) {
        opts.logger.warn("the HTTP edge kept its certificate: the new one did not load", { error: String(err) });
      }
    };
    // Both files: a renewal writes one, then the other, and the pair loads only once both are new.
    watchFile(files.certFile, { interval: 5000 }, reload);
    watchFile(files.keyFile, { interval: 5000 }, reload);
    server = secure;
  } else {
    const h1 = http.createServer(handle);
    closeIdle = () => h1.closeIdleConnections();
    const h2 = http2.createServer(handle);
    server = net.createServer((socket) => {
      socket.once("data", (first: Buffer) => {
        socket.pause();
        socket.unshift(first);
        // HTTP/2 reads what is buffered itself; HTTP/1 needs the stream flowing again.
        if (first.subarray(0, 3).toString("latin1") === "PRI") h2.emit("connection", socket);
        else {
          h1.emit("connection", socket);
          socket.resume();
        }
      });
      socket.on("error", () => undefined);
    });
  }
  const open = new Set<net.Socket>();
  server.on("connection", (s: net.Socket) => (open.add(s), s.once("close", () => open.delete(s))));

  const [host, port] = splitHostPort(opts.address);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => (server.off("error", reject), resolve()));
  });
  const bound = (server.address() as net.AddressInfo).port;
  return {
    port: bound,
    async close(graceMs) {
      if (opts.tls) for (const file of [opts.tls.certFile, opts.tls.keyFile]) unwatchFile(file, reload);
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      closeIdle?.();
      const timer = setTimeout(() => {
        for (const s of open) s.destroy();
      }, graceMs);
      await closed;
      clearTimeout(timer);
    },
  };
}
