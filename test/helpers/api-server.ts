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

  /**
   * OpenAI's GET /v1/models/{model} (developers.openai.com/api/reference/resources/models/methods/
   * retrieve): the Model object, its shutdown_date null unless one is announced; a model not
   * served is 404 model_not_found, in the words the chat endpoint uses.
   */
  protected describeOpenAiModel(
    res: http.ServerResponse,
    url: string,
    models: readonly { id: string; shutdownDate?: string }[],
  ) {
    const id = decodeURIComponent(url.slice("/v1/models/".length));
    const model = models.find((m) => m.id === id);
    if (!model)
      return this.refuse(res, 404, {
        message: `The model \`${id}\` does not exist or you do not have access to it.`,
        type: "invalid_request_error",
        param: null,
        code: "model_not_found",
      });
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        id,
        object: "model",
        created: 1686935002,
        owned_by: "openai",
        shutdown_date: model.shutdownDate ?? null,
      }),
    );
  }

  protected refuse(res: http.ServerResponse, status: number, error: ApiError, headers: Record<string, string> = {}) {
    this.refused.push({ status, error });
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify({ error }));
  }
}
