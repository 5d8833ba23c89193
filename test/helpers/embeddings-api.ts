// An embeddings server that checks each request the way OpenAI's API does, written from the
// reference (https://platform.openai.com/docs/api-reference/embeddings/create and
// .../embeddings/object; errors as in https://platform.openai.com/docs/guides/error-codes), not from
// what Troupe sends:
// - POST /v1/embeddings with `Authorization: Bearer <key>`; a wrong key is 401 invalid_api_key;
// - `model` and `input` are required; `input` is a non-empty string or a list of 1 to 2,048
//   non-empty strings; `encoding_format` is "float" or "base64"; `dimensions` only for the
//   text-embedding-3 models; any other parameter is refused;
// - the answer is a list of embedding objects with their `index`, the model and the usage; with
//   "base64" each embedding is the little-endian float32 bytes in base64 (the SDK's default ask).
import type http from "node:http";
import { ApiServer } from "./api-server.js";
import type { ApiError } from "./openai-checks.js";

const MODELS: Record<string, { dim: number; dimensions: boolean }> = {
  "text-embedding-3-small": { dim: 1536, dimensions: true },
  "text-embedding-3-large": { dim: 3072, dimensions: true },
  "text-embedding-ada-002": { dim: 1536, dimensions: false },
};
const PARAMETERS = new Set(["model", "input", "encoding_format", "dimensions", "user"]);
const MAX_INPUTS = 2048;

const invalid = (message: string, param: string | null = null, code: string | null = null): ApiError => ({
  message,
  type: "invalid_request_error",
  param,
  code,
});

export class EmbeddingsApiServer extends ApiServer {
  /** Bodies of the requests answered, in order. */
  readonly accepted: Record<string, unknown>[] = [];
  /** Requests that reached the server, answered or not. */
  requests = 0;
  /** The next `count` requests get `status` (429 or 503) with this Retry-After. */
  outage?: { status: 429 | 503; retryAfterSeconds: number; count: number };

  constructor(private readonly apiKey: string) {
    super();
  }

  protected handle(req: http.IncomingMessage, text: string, res: http.ServerResponse): unknown {
    this.requests++;
    if (req.method !== "POST" || req.url !== "/v1/embeddings")
      return this.refuse(res, 404, invalid(`Invalid URL (${req.method} ${req.url})`));
    if (req.headers.authorization !== `Bearer ${this.apiKey}`)
      return this.refuse(res, 401, invalid("Incorrect API key provided.", null, "invalid_api_key"));
    if (this.outage && this.outage.count > 0) {
      this.outage.count--;
      const error =
        this.outage.status === 429
          ? { ...invalid("Rate limit reached for requests.", null, "rate_limit_exceeded"), type: "requests" }
          : { ...invalid("The server is overloaded or not ready yet."), type: "server_error" };
      return this.refuse(res, this.outage.status, error, { "retry-after": String(this.outage.retryAfterSeconds) });
    }
    let body: Record<string, unknown>;
    try {
      body = JSON.parse(text);
    } catch {
      return this.refuse(res, 400, invalid("We could not parse the JSON body of your request."));
    }
    const problem = check(body);
    if (problem) return this.refuse(res, problem.status, problem.error);
    this.accepted.push(body);
    const model = MODELS[body.model as string]!;
    const dim = (body.dimensions as number | undefined) ?? model.dim;
    const inputs = typeof body.input === "string" ? [body.input] : (body.input as string[]);
    const data = inputs.map((input, index) => {
      const vector = vectorOf(input, dim);
      const embedding =
        body.encoding_format === "base64" ? Buffer.from(Float32Array.from(vector).buffer).toString("base64") : vector;
      return { object: "embedding", index, embedding };
    });
    const tokens = inputs.reduce((n, s) => n + Math.ceil(s.length / 4), 0);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        object: "list",
        data,
        model: body.model,
        usage: { prompt_tokens: tokens, total_tokens: tokens },
      }),
    );
  }
}

function check(body: Record<string, unknown>): { status: number; error: ApiError } | undefined {
  const bad = (error: ApiError, status = 400) => ({ status, error });
  for (const key of Object.keys(body))
    if (!PARAMETERS.has(key)) return bad(invalid(`Unrecognized request argument supplied: ${key}`));
  if (typeof body.model !== "string") return bad(invalid("you must provide a model parameter"));
  const model = MODELS[body.model];
  if (!model)
    return bad(
      invalid(`The model \`${body.model}\` does not exist or you do not have access to it.`, null, "model_not_found"),
      404,
    );
  const input = body.input;
  const inputs = typeof input === "string" ? [input] : input;
  if (!Array.isArray(inputs) || inputs.length === 0 || inputs.length > MAX_INPUTS)
    return bad(invalid("'$.input' is invalid. Please check the API reference.", "input"));
  if (inputs.some((s) => typeof s !== "string" || s === ""))
    return bad(invalid("'$.input' is invalid. Please check the API reference.", "input"));
  if (body.encoding_format !== undefined && body.encoding_format !== "float" && body.encoding_format !== "base64")
    return bad(
      invalid(`'${body.encoding_format}' is not one of ['float', 'base64'] - 'encoding_format'`, "encoding_format"),
    );
  if (body.dimensions !== undefined) {
    if (!model.dimensions) return bad(invalid("This model does not support specifying dimensions.", "dimensions"));
    if (
      !Number.isInteger(body.dimensions) ||
      (body.dimensions as number) < 1 ||
      (body.dimensions as number) > model.dim
    )
      return bad(invalid("Invalid value for 'dimensions'.", "dimensions"));
  }
  return undefined;
}

/** A deterministic vector for a text, so a test can tell which text a vector belongs to. */
export function vectorOf(text: string, dim: number): number[] {
  const out = new Array<number>(dim).fill(0);
  for (let i = 0; i < text.length; i++) out[(text.charCodeAt(i) * 31 + i) % dim] += 1;
  out[0] += text.length;
  return out;
}
