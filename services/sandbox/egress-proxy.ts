// The way out of a sandbox, on the service's side: an HTTP proxy on every connection a command
// makes to its sandbox's egress port (127.0.0.1:3128 inside; agent-socket.ts carries it here).
// The container itself has no network, so this is the only route, and it goes only where the
// sandbox's grant says. What it checks is the first request of a connection, and only that:
//   - `CONNECT host:port` (https, and anything tunnelled): the host and port are checked, then the
//     tunnel carries the command's own bytes, unread (TLS to the host, as a rule). What travels
//     inside is the command's business: a CONNECT allowlist cannot see a TLS name or an inner
//     Host header naming another site on the same address (a CDN's), nor what is sent to an
//     allowed host (docs/sandbox.md, egress);
//   - absolute-form `GET http://...`, and absolute-form `GET https://...` (BusyBox wget's way,
//     which has no CONNECT: this side makes the TLS connection and checks the host's
//     certificate): one request a connection. Its body is passed on by its Content-Length
//     (a chunked body is refused with 411), upstream is asked to close after answering, and any
//     byte the command sends after that request is a second request nobody checked: it is not
//     passed on, and the connection ends with the first answer;
//   - the host must be in the grant's allowed hosts (names, *.suffix, or addresses), and then
//     pass the same SSRF guard as web_fetch (shared/net/net-guard.ts): resolved once, every address
//     public, the connection pinned to the address checked, ports from TROUPE_NET_PORTS;
//   - where the deployment names an HTTP proxy (HTTPS_PROXY, HTTP_PROXY, NO_PROXY), the connection
//     to the checked address is a CONNECT tunnel through it (shared/net/proxy-tunnel.ts);
//   - a byte budget per sandbox, both directions together; a connection that spends it is cut;
//   - every connection is logged with the sandbox's scope key (its tenant and session).
// A refusal is an HTTP answer (403, 400, 502) whose body says why, so curl, pip and npm show it.
import { connect, isIP, type Socket } from "node:net";
import { checkServerIdentity, connect as connectTls } from "node:tls";
import type { Duplex } from "node:stream";
import type { Logger } from "../shared/process/log.js";
import { checkTarget, hostMatches, NetRefusal, type NetPolicy } from "../shared/net/net-guard.js";
import { proxyFor, proxyHosts } from "../shared/net/outbound-proxy.js";
import { connectThrough } from "../shared/net/proxy-tunnel.js";

/** What commands in one sandbox may reach, and what they have used. */
export interface EgressState {
  /** Host names, `*.example.com` patterns, or addresses; empty: no way out. */
  hosts: string[];
  /** Bytes both ways over the sandbox's life. */
  budgetBytes: number;
  usedBytes: number;
}

const HEAD_LIMIT = 16 * 1024;
const HEAD_TIMEOUT_MS = 10_000;
const CONNECT_TIMEOUT_MS = 10_000;
/** A connection with no bytes either way for this long is closed. */
const IDLE_TIMEOUT_MS = 120_000;
/** How long a refused connection may stay open for its answer to be read. */
const REFUSED_LINGER_MS = 5000;
const HOP_HEADERS = new Set(["connection", "keep-alive", "proxy-connection", "proxy-authorization", "host", "te"]);

class Refused extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const REASONS: Record<number, string> = {
  400: "Bad Request",
  403: "Forbidden",
  408: "Request Timeout",
  411: "Length Required",
  431: "Request Header Fields Too Large",
  502: "Bad Gateway",
};

function answer(status: number, text: string): string {
  const body = `troupe egress: ${text}\n`;
  return `HTTP/1.1 ${status} ${REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

/** The request head and whatever followed it, or a Refused. */
function readHead(socket: Duplex): Promise<{ head: string; rest: Buffer }> {
  return new Promise((resolve, reject) => {
    let got = Buffer.alloc(0);
    const finish = (err?: Error, value?: { head: string; rest: Buffer }) => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("error", onEnd);
      socket.pause();
      if (err) reject(err);
      else resolve(value!);
    };
    const onData = (chunk: Buffer) => {
      got = Buffer.concat([got, chunk]);
      const end = got.indexOf("\r\n\r\n");
      if (end >= 0 && end <= HEAD_LIMIT)
        finish(undefined, { head: got.subarray(0, end).toString("latin1"), rest: got.subarray(end + 4) });
      else if (got.length > HEAD_LIMIT) finish(new Refused(431, `the request head is over ${HEAD_LIMIT} bytes`));
    };
    const onEnd = () => finish(new Refused(400, "the connection ended before a request"));
    const timer = setTimeout(() => finish(new Refused(408, "no request within 10 s")), HEAD_TIMEOUT_MS);
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("error", onEnd);
  });
}

interface Plan {
  /** What the log calls it: CONNECT host:port, or GET http://host/path. */
  what: string;
  url: URL;
  tunnel: boolean;
  /** For a plain http request: the head to send upstream, and the length of its body. */
  upstreamHead?: string;
  bodyBytes?: number;
}

/** Reads the request line and headers into what to do; throws Refused for anything else. */
function plan(head: string): Plan {
  const [line, ...headerLines] = head.split("\r\n");
  const m = /^([A-Z]{1,20}) (\S{1,8000}) (HTTP\/1\.[01])$/.exec(line);
  if (!m) throw new Refused(400, "not an HTTP/1 request line");
  const [, method, target, version] = m;
  if (method === "CONNECT") {
    let url: URL;
    try {
      url = new URL(`https://${target}/`);
    } catch {
      throw new Refused(400, `CONNECT needs host:port, not ${JSON.stringify(target.slice(0, 100))}`);
    }
    if (!/:\d+$/.test(target) || url.pathname !== "/" || `${url.host}` === "")
      throw new Refused(400, `CONNECT needs host:port, not ${JSON.stringify(target.slice(0, 100))}`);
    return { what: `CONNECT ${target}`, url, tunnel: true };
  }
  if (!target.startsWith("http://") && !target.startsWith("https://"))
    throw new Refused(400, "this is a proxy: the request needs an absolute http:// or https:// URL");
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    throw new Refused(400, `${JSON.stringify(target.slice(0, 100))} is not a URL`);
  }
  // Host is set from the URL: a Host header naming another site on an allowed address (a CDN's)
  // would otherwise reach that site.
  const headers = headerLines.filter((h) => !HOP_HEADERS.has(h.slice(0, h.indexOf(":")).trim().toLowerCase()));
  const bodyBytes = bodyLength(headers);
  const upstreamHead = [
    `${method} ${url.pathname}${url.search} ${version}`,
    `Host: ${url.host}`,
    ...headers,
    "Connection: close",
    "",
    "",
  ].join("\r\n");
  return {
    what: `${method} ${url.origin}${url.pathname}`.slice(0, 300),
    url,
    tunnel: false,
    upstreamHead,
    bodyBytes,
  };
}

/**
 * The length of a plain request's body, from its one Content-Length (RFC 9112 §6.3); a chunked
 * or otherwise encoded body is refused, so that where the request ends is never a guess.
 */
function bodyLength(headers: string[]): number {
  const named = (name: string) =>
    headers
      .filter((h) => h.slice(0, h.indexOf(":")).trim().toLowerCase() === name)
      .map((h) => h.slice(h.indexOf(":") + 1).trim());
  if (named("transfer-encoding").length > 0)
    throw new Refused(411, "a request body through this proxy needs a Content-Length (https:// tunnels take any)");
  const lengths = named("content-length");
  if (lengths.length === 0) return 0;
  if (lengths.length > 1 || !/^\d{1,15}$/.test(lengths[0]))
    throw new Refused(400, "the request needs one Content-Length, a number");
  return Number(lengths[0]);
}

/**
 * A connection to the checked address, directly or through `via` (the deployment's HTTP proxy,
 * by a CONNECT tunnel to that address); with `tls`, a TLS one whose certificate must be that host's.
 */
async function connectTo(address: string, port: number, tls?: { host: string }, via?: string): Promise<Socket> {
  const tunnel = via ? await connectThrough(via, address, port, CONNECT_TIMEOUT_MS) : undefined;
  if (tunnel && !tls) return tunnel;
  return new Promise((resolve, reject) => {
    const upstream = tls
      ? connectTls({
          ...(tunnel ? { socket: tunnel } : { host: address, port }),
          servername: isIP(tls.host) ? undefined : tls.host,
          checkServerIdentity: (_address, cert) => checkServerIdentity(tls.host, cert),
        })
      : connect({ host: address, port });
    const timer = setTimeout(() => upstream.destroy(new Error("timed out")), CONNECT_TIMEOUT_MS);
    upstream.once(tls ? "secureConnect" : "connect", () => (clearTimeout(timer), resolve(upstream)));
    upstream.once("error", (err) => (clearTimeout(timer), reject(err)));
  });
}

export class EgressProxy {
  constructor(
    private readonly policy: NetPolicy,
    private readonly logger: Logger,
  ) {}

  /** Serves one command's connection for the sandbox `key`, whose grant and budget are `state`. */
  serve(socket: Duplex, key: string, state: EgressState): void {
    void this.run(socket, key, state);
  }

  private async run(socket: Duplex, key: string, state: EgressState): Promise<void> {
    const started = Date.now();
    const counts = { up: 0, down: 0 };
    let what = "(no request)";
    socket.on("error", () => undefined);
    const log = (outcome: string) =>
      this.logger.info(`egress ${what}: ${outcome}`, {
        scope: key,
        bytesUp: counts.up,
        bytesDown: counts.down,
        ms: Date.now() - started,
      });
    let upstream: Socket;
    let rest: Buffer;
    let target: Plan;
    try {
      const read = await readHead(socket);
      rest = read.rest;
      target = plan(read.head);
      what = target.what;
      if (state.hosts.length === 0)
        throw new Refused(403, "this sandbox has no way out (its agent's egress.allowHosts is empty)");
      if (state.usedBytes >= state.budgetBytes)
        throw new Refused(403, `this sandbox has spent its egress budget of ${state.budgetBytes} bytes`);
      if (!hostMatches(target.url.hostname, state.hosts))
        throw new Refused(403, `${target.url.hostname} is not among this sandbox's allowed hosts`);
      let checked: Awaited<ReturnType<typeof checkTarget>>;
      try {
        checked = await checkTarget(target.url, this.policy);
      } catch (err) {
        if (err instanceof NetRefusal) throw new Refused(403, err.message);
        throw err;
      }
      const tls = !target.tunnel && target.url.protocol === "https:";
      const host = target.url.hostname.replace(/^\[|\]$/g, "");
      const port = Number(target.url.port || (target.tunnel || tls ? 443 : 80));
      // A command's CONNECT is an https:// URL here (plan), so it takes HTTPS_PROXY as undici would.
      const via = proxyFor(this.policy.proxy, target.url);
      try {
        upstream = await connectTo(checked.address, port, tls ? { host } : undefined, via);
      } catch (err) {
        throw new Refused(502, `could not connect to ${target.url.hostname}:${port} (${(err as Error).message})`);
      }
      what += ` (${checked.address}${via ? `, through the proxy at ${proxyHosts({ httpsProxy: via })}` : ""})`;
    } catch (err) {
      const refused = err instanceof Refused ? err : new Refused(502, (err as Error).message);
      log(`refused, ${refused.status}: ${refused.message}`);
      if (!socket.destroyed) socket.end(answer(refused.status, refused.message));
      // A command that keeps a refused connection open does not keep its slot in the agent.
      setTimeout(() => socket.destroy(), REFUSED_LINGER_MS).unref();
      return;
    }

    let cut = "";
    let idle: NodeJS.Timeout | undefined;
    const close = (why: string) => {
      cut ||= why;
      socket.destroy();
      upstream.destroy();
    };
    const touch = () => {
      clearTimeout(idle);
      idle = setTimeout(() => close(`idle for ${IDLE_TIMEOUT_MS / 1000} s`), IDLE_TIMEOUT_MS);
    };
    const spend = (n: number, way: "up" | "down") => {
      counts[way] += n;
      state.usedBytes += n;
      touch();
      if (state.usedBytes > state.budgetBytes) close(`cut: the egress budget of ${state.budgetBytes} bytes is spent`);
    };
    touch();
    upstream.on("error", () => close("the upstream connection failed"));
    socket.on("data", (chunk: Buffer) => spend(chunk.length, "up"));
    upstream.on("data", (chunk: Buffer) => spend(chunk.length, "down"));
    let open = 2;
    const closed = () => {
      if (--open > 0) return;
      clearTimeout(idle);
      log(cut || "done");
    };
    // The command's side closes only when both its directions are done (or it is cut).
    socket.once("close", () => (upstream.destroy(), closed()));
    // Reading on after the upstream is gone lets the command's own end (and so its close) be seen.
    upstream.once("close", () => (socket.destroyed || (socket.end(), socket.resume()), closed()));

    upstream.pipe(socket);
    if (target.tunnel) {
      socket.write("HTTP/1.1 200 Connection established\r\n\r\n");
      if (rest.length > 0) {
        spend(rest.length, "up");
        upstream.write(rest);
      }
      // A tunnel's bytes are the command's own protocol: its half-close is passed on too.
      socket.pipe(upstream);
    } else {
      upstream.write(target.upstreamHead!);
      spend(Buffer.byteLength(target.upstreamHead!), "up");
      // The one checked request's body, by its length; nothing after it. The request asked for
      // Connection: close, so a command's half-close (busybox wget's, after every request) stays
      // here: passed on into TLS it is a close_notify, and an https:// proxy drops the tunnel on
      // it before the answer.
      let left = target.bodyBytes!;
      let refusedMore = false;
      const up = (chunk: Buffer) => {
        const take = Math.min(left, chunk.length);
        if (take > 0) {
          left -= take;
          upstream.write(take === chunk.length ? chunk : chunk.subarray(0, take));
        }
        if (take < chunk.length && !refusedMore) {
          refusedMore = true;
          cut ||= "a second request on this connection was not passed on (one checked request a connection)";
        }
      };
      if (rest.length > 0) {
        spend(rest.length, "up");
        up(rest);
      }
      socket.on("data", up);
    }
    socket.resume();
  }
}
