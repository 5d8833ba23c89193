// Deadlines and a cap for the HTTP edge's connections, so that nobody holds one open for free.
// Node's own HTTP/1 header and request timeouts run only in a server that listens itself (this
// edge hands sockets over after reading their first bytes), and HTTP/2 has none, so they are kept
// here, one timer per connection and one per request body, for every protocol the edge speaks:
//
//   - first bytes: a new connection must send something (TLS: finish its handshake) in time;
//   - request head: a connection with no request open must complete the next request's head in
//     time (HTTP/1: from its first byte or the end of the last response; HTTP/2: its next stream,
//     or the session is closed);
//   - body: a request's body must have arrived in time after its head, answered or not (a refused
//     request's body is discarded as it comes, until then). A streaming response (Subscribe, /v1
//     streams) is never cut: these clocks stop once the request is in.
//   - a cap on open connections (net.Server's maxConnections): one over it is dropped at accept,
//     and the drop is logged (at most once every 10 s, with the count) and counted in a metric.
import type http from "node:http";
import http2 from "node:http2";
import type net from "node:net";
import type { Logger } from "../../shared/process/log.js";
import type { NodeServerRequest as AnyRequest, NodeServerResponse as AnyResponse } from "./answer.js";
import { instruments } from "../../shared/process/metrics.js";

export interface ConnectionLimits {
  /** From accept to the first byte (TLS: to the end of the handshake). */
  firstByteMs: number;
  /** From the start of a request (or the connection's going idle) to the end of its head. */
  headMs: number;
  /** From a request's head to the end of its body. */
  bodyMs: number;
  /** A kept-alive HTTP/1 connection or an HTTP/2 session with no request open closes after this. */
  idleMs: number;
  /** Open connections at most; more are dropped at accept. */
  maxConnections: number;
}

/** A connection's one clock: armed for one deadline at a time, or stopped. */
class Clock {
  private timer?: NodeJS.Timeout;
  constructor(private readonly onExpiry: (what: string) => void) {}
  arm(ms: number, what: string): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.onExpiry(what), ms);
    this.timer.unref();
  }
  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

const h1State = new WeakMap<net.Socket, { clock: Clock; open: number }>();

export class ConnectionGuard {
  private dropped = 0;
  private lastDropLog = 0;

  constructor(
    private readonly limits: ConnectionLimits,
    private readonly logger: Logger,
  ) {}

  /** The listening server: the cap, and the drop's log line and metric. */
  guardServer(server: net.Server): void {
    server.maxConnections = this.limits.maxConnections;
    server.on("drop", () => this.drop());
  }

  private drop(): void {
    this.dropped++;
    instruments().httpConnectionsRefused.add(1, { reason: "max_connections" });
    const now = Date.now();
    if (now - this.lastDropLog < 10_000) return;
    this.lastDropLog = now;
    this.logger.warn("the HTTP edge refused connections: it holds TROUPE_HTTP_MAX_CONNECTIONS open", {
      maxConnections: this.limits.maxConnections,
      refusedSoFar: this.dropped,
    });
  }

  private expire(what: string, close: () => void): void {
    instruments().httpConnectionsRefused.add(1, { reason: what });
    close();
  }

  /** A raw connection just accepted: its first bytes are due. Returns a stop for when they came. */
  firstBytes(socket: net.Socket): () => void {
    const clock = new Clock((what) => this.expire(what, () => socket.destroy()));
    clock.arm(this.limits.firstByteMs, "first_byte");
    socket.once("close", () => clock.stop());
    return () => clock.stop();
  }

  /** An HTTP/1 connection handed to the HTTP/1 server: its first request's head is due. */
  http1(socket: net.Socket): void {
    const clock = new Clock((what) => this.expire(what, () => socket.destroy()));
    h1State.set(socket, { clock, open: 0 });
    clock.arm(this.limits.headMs, "head");
    socket.once("close", () => clock.stop());
  }

  /** An HTTP/2 session: no stream open for the head deadline (then the idle one) closes it. */
  http2(session: http2.ServerHttp2Session): void {
    let open = 0;
    const clock = new Clock((what) => this.expire(what, () => session.close()));
    clock.arm(this.limits.headMs, "head");
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      open++;
      clock.stop();
      stream.once("close", () => {
        if (--open === 0 && !session.closed) clock.arm(this.limits.idleMs, "idle");
      });
    });
    session.once("close", () => clock.stop());
  }

  /** Every request, either protocol: its body is due; an HTTP/1 connection's head clock waits. */
  request(req: AnyRequest, res: AnyResponse): void {
    const h2 = "stream" in req ? req.stream : undefined;
    if (!h2) {
      const state = h1State.get(req.socket);
      if (state) {
        state.open++;
        state.clock.stop();
        res.once("close", () => {
          // Idle, then the next head: the whole gap is bounded, a byte a minute holds nothing.
          if (--state.open === 0 && !req.socket.destroyed)
            state.clock.arm(this.limits.idleMs + this.limits.headMs, "head");
        });
      }
    }
    if (bodyIn(req)) return;
    const clock = new Clock((what) => {
      if (bodyIn(req)) return;
      this.expire(what, () => {
        if (!res.headersSent)
          (res as http.ServerResponse)
            .writeHead(408, { "content-type": "text/plain", connection: "close" })
            .end("the request body did not arrive in time\n");
        if (h2) h2.close(http2.constants.NGHTTP2_CANCEL);
        else setImmediate(() => req.socket.destroy());
      });
    });
    clock.arm(this.limits.bodyMs, "body");
    // Only the body's end, or its connection's (stream's), stops it: an answer sent early (a
    // refusal, a 404) does not, or a client could trickle an unread body for ever. The close
    // listener goes with the body's end: a kept-alive connection carries many requests.
    const carrier = h2 ?? req.socket;
    const closed = () => clock.stop();
    carrier.once("close", closed);
    req.once("end", () => {
      clock.stop();
      carrier.off("close", closed);
    });
  }
}

/** Whether the client has sent all of the request (read by the handler or not). */
function bodyIn(req: AnyRequest): boolean {
  if ("stream" in req) {
    const state = req.stream.state?.state;
    return (
      req.stream.destroyed ||
      state === http2.constants.NGHTTP2_STREAM_STATE_HALF_CLOSED_REMOTE ||
      state === http2.constants.NGHTTP2_STREAM_STATE_CLOSED
    );
  }
  return req.complete;
}
