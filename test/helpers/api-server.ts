// The part every provider test server shares: a loopback server on a free port, its API root, and
// the refusals it sent (each an error object in the providers' shape). Plain, it speaks HTTP/1.1,
// as local servers (Ollama, vLLM) do; with a certificate, HTTPS offering h2 before http/1.1 by
// ALPN, as the hosted APIs' edges do, so a client that can speak HTTP/2 does (undici's default).
import http from "node:http";
import http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { ApiError } from "./openai-checks.js";

/** A certificate and its key, PEM; and the streams one HTTP/2 connection may carry (SETTINGS). */
export interface TlsIdentity {
  cert: Buffer | string;
  key: Buffer | string;
  maxConcurrentStreams?: number;
}

export abstract class ApiServer {
  /** Every refusal sent: status and the error object. */
  readonly refused: { status: number; error: ApiError }[] = [];
  /** The HTTP version of each request, in order ("1.1", "2.0"). */
  readonly httpVersions: string[] = [];
  /**
   * Responses the client left before they ended: an aborted reply, its HTTP/2 stream reset or its
   * HTTP/1.1 connection closed.
   */
  unfinished = 0;
  /** The most requests one HTTP/2 connection carried at once. */
  streamsAtOnce = 0;
  /** TCP connections clients opened to this server. */
  connections = 0;
  /** Connections that have closed since, either side closing. */
  closedConnections = 0;
  /**
   * When a streamed body's end goes out after its final event: in the same write (as a server that
   * ends the response with its last event does), this many ms later (as a server or proxy that
   * flushes each event as it comes and ends the response afterwards does), or never (a response
   * held open), or after `junk` bytes of SSE comments following the final event.
   */
  bodyEnd: "together" | "never" | number | { junk: number } = "together";
  /**
   * Set, the n-th HTTP/2 request from now makes its connection send GOAWAY naming the first of
   * them as the last stream it took: the 2nd to n-th (and any sent after) are refused unprocessed,
   * which RFC 9113 (section 8.7) lets a client send again. Cleared once sent.
   */
  goAwayAtRequest?: number;
  private goAwayArmed?: { count: number; lastTaken: number };
  private server?: http.Server | http2.Http2SecureServer;
  private readonly sockets = new Set<Socket>();
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private readonly openStreams = new WeakMap<http2.Http2Session, number>();
  private host = "127.0.0.1";
  private secure = false;

  /** The API root, as a client's base URL: http(s)://127.0.0.1:<port>/v1. */
  get baseUrl(): string {
    return `${this.secure ? "https" : "http"}://${this.host}:${(this.server!.address() as AddressInfo).port}/v1`;
  }

  /**
   * Listens on `host` (a loopback address other than 127.0.0.1 is not one a proxy skips); with
   * `tls`, over HTTPS with h2 and http/1.1 offered.
   */
  async start(host = "127.0.0.1", tls?: TlsIdentity): Promise<this> {
    this.host = host;
    this.secure = tls !== undefined;
    // node:http2's compatibility request and response take every call these servers make
    // (method, url, headers, writeHead, write, end), so one handler serves both versions.
    const onRequest = (req: http.IncomingMessage | http2.Http2ServerRequest, res: object) => {
      this.httpVersions.push(req.httpVersion);
      const response = res as http.ServerResponse;
      const session = "stream" in req ? req.stream.session : undefined;
      if (session && this.refusedByGoAway(req as http2.Http2ServerRequest)) return;
      if (session) {
        const open = (this.openStreams.get(session) ?? 0) + 1;
        this.openStreams.set(session, open);
        this.streamsAtOnce = Math.max(this.streamsAtOnce, open);
      }
      response.on("close", () => {
        if (session) this.openStreams.set(session, this.openStreams.get(session)! - 1);
        if (!response.writableEnded) this.unfinished++;
      });
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => this.handle(req as http.IncomingMessage, Buffer.concat(chunks).toString("utf8"), response));
    };
    this.server = tls
      ? http2.createSecureServer(
          {
            cert: tls.cert,
            key: tls.key,
            allowHTTP1: true,
            settings: tls.maxConcurrentStreams ? { maxConcurrentStreams: tls.maxConcurrentStreams } : {},
          },
          onRequest,
        )
      : http.createServer(onRequest);
    this.server.on("connection", (socket: Socket) => {
      this.connections++;
      this.sockets.add(socket);
      socket.on("close", () => (this.closedConnections++, this.sockets.delete(socket)));
    });
    this.server.on("session", (session: http2.ServerHttp2Session) => {
      this.sessions.add(session);
      session.on("close", () => this.sessions.delete(session));
    });
    await new Promise<void>((resolve) => this.server!.listen(0, host, resolve));
    return this;
  }

  /** Whether this request is one a GOAWAY (goAwayAtRequest) refuses: held unanswered until it goes. */
  private refusedByGoAway(req: http2.Http2ServerRequest): boolean {
    if (!this.goAwayAtRequest) return false;
    const { stream } = req;
    if (!this.goAwayArmed) {
      this.goAwayArmed = { count: 1, lastTaken: stream.id ?? 0 };
      return false;
    }
    stream.on("error", () => undefined); // nghttp2 resets it with REFUSED_STREAM
    if (++this.goAwayArmed.count === this.goAwayAtRequest) {
      stream.session?.goaway(http2.constants.NGHTTP2_NO_ERROR, this.goAwayArmed.lastTaken);
      this.goAwayAtRequest = this.goAwayArmed = undefined;
    }
    return true;
  }

  /**
   * Closes every HTTP/2 connection gracefully, as an edge rotating its connections does: a GOAWAY
   * naming the last stream it took, the streams up to it answered in full, then the close.
   */
  goAway(): void {
    for (const session of this.sessions) session.close();
  }

  /** Cuts every connection at once, mid-reply or not, as a crashed or unplugged server would. */
  cutConnections(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  async close(): Promise<void> {
    this.cutConnections();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()));
  }

  /** Answers one request whose body is `text`. */
  protected abstract handle(req: http.IncomingMessage, text: string, res: http.ServerResponse): unknown;

  /** Sends a streamed body's last bytes (its final event) and ends it as `bodyEnd` says. */
  protected endStream(res: http.ServerResponse, last: string): void {
    const end = this.bodyEnd;
    if (end === "together") return void res.end(last);
    res.write(last);
    if (typeof end === "number") setTimeout(() => res.end(), end);
    else if (end !== "never") res.write(`: ${"x".repeat(end.junk)}\n\n`);
  }

  protected refuse(res: http.ServerResponse, status: number, error: ApiError, headers: Record<string, string> = {}) {
    this.refused.push({ status, error });
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify({ error }));
  }
}
