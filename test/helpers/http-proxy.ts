// A forward HTTP proxy as the RFCs describe one, for the outbound-proxy tests: a request in
// absolute form (RFC 9112 §3.2.2, `POST http://host:port/path`) is forwarded and its answer
// relayed; CONNECT host:port (RFC 9110 §9.3.6) opens a tunnel and answers 200 once it is up. With
// `credentials`, a request without them gets 407 and a Proxy-Authenticate challenge (RFC 9110
// §11.7.1, Basic as RFC 7617 defines it). It records every request it is asked to carry.
import http from "node:http";
import https from "node:https";
import net from "node:net";
import type { AddressInfo } from "node:net";

export interface ProxiedRequest {
  method: string;
  /** host:port for CONNECT, the absolute URL otherwise. */
  target: string;
}

export class HttpProxy {
  readonly seen: ProxiedRequest[] = [];
  private readonly server: http.Server | https.Server;
  /** CONNECT tunnels still open, client side; the server's own bookkeeping forgets upgraded sockets. */
  private readonly tunnels = new Set<net.Socket>();

  /**
   * `credentials`: "user:password" a client must send in Proxy-Authorization. `tls`: the proxy
   * itself is reached over TLS (an https:// proxy URL) with this key and certificate.
   */
  constructor(
    private readonly credentials?: string,
    private readonly tls?: { key: Buffer; cert: Buffer },
  ) {
    const handle = (req: http.IncomingMessage, res: http.ServerResponse) => this.forward(req, res);
    this.server = tls ? https.createServer(tls, handle) : http.createServer(handle);
    this.server.on("connect", (req: http.IncomingMessage, socket: net.Socket, head: Buffer) =>
      this.tunnel(req, socket, head),
    );
  }

  get url(): string {
    return `${this.tls ? "https" : "http"}://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return this;
  }

  /** How many CONNECT tunnels are open now. */
  get openTunnels(): number {
    return this.tunnels.size;
  }

  async close(): Promise<void> {
    for (const socket of this.tunnels) socket.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private authorized(req: http.IncomingMessage): boolean {
    if (!this.credentials) return true;
    return req.headers["proxy-authorization"] === `Basic ${Buffer.from(this.credentials).toString("base64")}`;
  }

  private forward(req: http.IncomingMessage, res: http.ServerResponse): void {
    this.seen.push({ method: req.method ?? "", target: req.url ?? "" });
    if (!this.authorized(req)) {
      res.writeHead(407, { "proxy-authenticate": 'Basic realm="proxy"', "content-type": "text/plain" });
      return void res.end("proxy authentication required");
    }
    let url: URL;
    try {
      url = new URL(req.url ?? "");
    } catch {
      res.writeHead(400);
      return void res.end("a proxy takes requests in absolute form");
    }
    const headers = { ...req.headers };
    delete headers["proxy-authorization"];
    delete headers["proxy-connection"];
    const upstream = http.request(
      { host: url.hostname, port: url.port, path: `${url.pathname}${url.search}`, method: req.method, headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on("error", () => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    req.pipe(upstream);
  }

  private tunnel(req: http.IncomingMessage, socket: net.Socket, head: Buffer): void {
    this.seen.push({ method: "CONNECT", target: req.url ?? "" });
    socket.on("error", () => undefined);
    this.tunnels.add(socket);
    socket.once("close", () => this.tunnels.delete(socket));
    if (!this.authorized(req))
      return void socket.end(
        'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="proxy"\r\n\r\n',
      );
    const at = (req.url ?? "").lastIndexOf(":");
    const upstream = net.connect(Number((req.url ?? "").slice(at + 1)), (req.url ?? "").slice(0, at), () => {
      socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      upstream.write(head);
      upstream.pipe(socket);
      socket.pipe(upstream);
    });
    upstream.on("error", () => socket.end("HTTP/1.1 502 Bad Gateway\r\n\r\n"));
    // Either side's close ends the tunnel, as squid's does; resume so the client's own close is seen.
    socket.once("close", () => upstream.destroy());
    upstream.once("close", () => (socket.end(), socket.resume()));
  }
}
