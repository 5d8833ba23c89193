// The part every provider test server shares: a loopback HTTP server on a free port, its API
// root, and the refusals it sent (each an error object in the providers' shape).
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { ApiError } from "./openai-checks.js";

export abstract class ApiServer {
  /** Every refusal sent: status and the error object. */
  readonly refused: { status: number; error: ApiError }[] = [];
  private server?: http.Server;

  /** The API root, as a client's base URL: http://127.0.0.1:<port>/v1. */
  get baseUrl(): string {
    return `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}/v1`;
  }

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => this.handle(req, Buffer.concat(chunks).toString("utf8"), res));
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    return this;
  }

  async close(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()));
  }

  /** Answers one request whose body is `text`. */
  protected abstract handle(req: http.IncomingMessage, text: string, res: http.ServerResponse): unknown;

  protected refuse(res: http.ServerResponse, status: number, error: ApiError, headers: Record<string, string> = {}) {
    this.refused.push({ status, error });
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify({ error }));
  }
}
