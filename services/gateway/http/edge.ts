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
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { context } from "@opentelemetry/api";
import type { DescService } from "@bufbuild/protobuf";
import { AdminService } from "../../shared/gen/troupe/v1/admin_pb.js";
import { GatewayService } from "../../shared/gen/troupe/v1/gateway_pb.js";
import type { Authenticator } from "../../shared/auth/auth.js";
import { splitHostPort } from "../../shared/net/host-port.js";
import { failure, type Logger } from "../../shared/process/log.js";
import type { ServiceClient } from "../../shared/rpc.js";
import { extractContext } from "../../shared/process/telemetry.js";
import { admission } from "./admission.js";
import { ConnectionGuard, type ConnectionLimits } from "./connection-guard.js";
import { answer, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import { forwardedMetadata } from "./metadata.js";

export type GatewayClient = ServiceClient<(typeof GatewayService)["method"]>;
export type AdminClient = ServiceClient<(typeof AdminService)["method"]>;

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
   * The gRPC server's own check of a call's credentials, made here before any route reads a
   * request's body (admission.ts): as on the gRPC port, a caller without a valid key is told
   * so, not what else is wrong with its request, and costs no decoding.
   */
  authenticate: Authenticator;
  /** Whether the gateway takes new work: /readyz answers 200 while it does, 503 from its drain on. */
  ready?: () => boolean;
  /** Requests anyone may make besides /healthz and /readyz (the console's files). */
  isPublic?: (req: NodeServerRequest) => boolean;
  /** Deadlines for every connection's bytes and a cap on their number (connection-guard.ts). */
  connections: ConnectionLimits;
  /** Requests the Connect routes do not take (the OpenAI-compatible endpoint); false: not its. */
  fallback?: (req: NodeServerRequest, res: NodeServerResponse) => Promise<boolean>;
  logger: Logger;
}

export interface HttpEdge {
  port: number;
  /** Stops accepting; open streams end within graceMs. */
  close(graceMs: number): Promise<void>;
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
      // Liveness: the process answers. Readiness: it takes new work (not while draining).
      if (req.url === "/healthz") return answer(res, 200, { "content-type": "text/plain" }, "ok\n");
      if (req.url === "/readyz")
        return (opts.ready?.() ?? true)
          ? answer(res, 200, { "content-type": "text/plain" }, "ready\n")
          : answer(res, 503, { "content-type": "text/plain" }, "draining\n");
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
  const guard = new ConnectionGuard(opts.connections, opts.logger);
  const admitted = admission(opts.authenticate, opts.isPublic ?? (() => false));
  /** What every request meets first, from its head alone; true when it may go on to its route. */
  const admit = (req: NodeServerRequest, res: NodeServerResponse, expectsContinue: boolean) => {
    guard.request(req, res);
    // The routes read the target as a URL; one that is not (`GET http://[`) is the client's
    // error, answered before any of them can throw on it.
    if (!URL.canParse(req.url ?? "", "http://troupe")) {
      req.resume();
      answer(res, 400, { "content-type": "text/plain" }, "the request target is not a URL\n");
      return false;
    }
    if (opts.cors.length > 0 && cors(opts.cors, req, res)) return false;
    return admitted(req, res, expectsContinue);
  };
  const handle = (req: NodeServerRequest, res: NodeServerResponse) => {
    if (admit(req, res, false)) connect(req, res);
  };
  // `Expect: 100-continue`: the client waits to send its body until told to; it is told only
  // once its key is good (Node would otherwise say so on its own, before any check).
  const handleExpecting = (req: NodeServerRequest, res: NodeServerResponse) => {
    if (!admit(req, res, true)) return;
    res.writeContinue();
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
      {
        cert: readFileSync(files.certFile),
        key: readFileSync(files.keyFile),
        allowHTTP1: true,
        // The first-byte deadline, as TLS has it: the whole handshake within it.
        handshakeTimeout: opts.connections.firstByteMs,
      },
      handle,
    );
    secure.on("checkContinue", handleExpecting);
    secure.on("session", (session) => guard.http2(session));
    secure.on("secureConnection", (tls) => {
      if (tls.alpnProtocol !== "h2") guard.http1(tls);
    });
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
    const h1 = http.createServer({ keepAliveTimeout: opts.connections.idleMs }, handle);
    h1.on("checkContinue", handleExpecting);
    closeIdle = () => h1.closeIdleConnections();
    const h2 = http2.createServer(handle);
    h2.on("checkContinue", handleExpecting);
    h2.on("session", (session) => guard.http2(session));
    server = net.createServer((socket) => {
      const firstBytesCame = guard.firstBytes(socket);
      socket.once("data", (first: Buffer) => {
        firstBytesCame();
        socket.pause();
        socket.unshift(first);
        // HTTP/2 reads what is buffered itself; HTTP/1 needs the stream flowing again.
        if (first.subarray(0, 3).toString("latin1") === "PRI") h2.emit("connection", socket);
        else {
          guard.http1(socket);
          h1.emit("connection", socket);
          socket.resume();
        }
      });
      socket.on("error", () => undefined);
    });
  }
  guard.guardServer(server);
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
