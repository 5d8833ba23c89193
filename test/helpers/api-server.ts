// The part every provider test server shares: a loopback HTTP server on a free port, its API
// root, and the refusals it sent (each an error object in the providers' shape).
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { ApiError } from "./openai-checks.js";

export abstract class ApiServer {
  /** Every refusal sent: status and the error object. */
  readonly refused: { status: number; error: ApiError }[] = [];
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
  private server?: http.Server;
  private host = "127.0.0.1";

  /** The API root, as a client's base URL: http://127.0.0.1:<port>/v1. */
  get baseUrl(): string {
    return `http://${this.host}:${(this.server!.address() as AddressInfo).port}/v1`;
  }

  /** Listens on `host` (a loopback address other than 127.0.0.1 is not one a proxy skips). */
  async start(host = "127.0.0.1"): Promise<this> {
    this.host = host;
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => this.handle(req, Buffer.concat(chunks).toString("utf8"), res));
    });
    this.server.on("connection", (socket) => {
      this.connections++;
      socket.on("close", () => this.closedConnections++);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, host, resolve));
    return this;
  }

  async close(): Promise<void> {
    this.server?.closeAllConnections();
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
