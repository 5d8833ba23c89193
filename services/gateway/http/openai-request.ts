// The requests and errors of the OpenAI-compatible endpoint (openai-compat.ts), as OpenAI's API
// reference has them: https://platform.openai.com/docs/api-reference/chat/create for the body,
// https://platform.openai.com/docs/guides/error-codes for errors and their HTTP statuses.
import { Status } from "../../shared/errors.js";
import { DEFAULT_AGENT, isAgentId } from "../../shared/ids.js";
import { answer, type NodeServerRequest, type NodeServerResponse } from "./answer.js";

export const MODEL_PREFIX = "troupe/";

/** An error as OpenAI answers it: HTTP status, and the body's type, code and param. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = "invalid_request_error",
    readonly code: string | null = null,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

/** A gRPC failure as OpenAI's clients expect it (their error classes go by the HTTP status). */
export function apiErrorOf(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { code?: number; details?: string; message?: string };
  const message = e.details || e.message || "internal error";
  switch (e.code) {
    case Status.UNAUTHENTICATED:
      return new ApiError(401, message, "invalid_request_error", "invalid_api_key");
    case Status.PERMISSION_DENIED:
      return new ApiError(403, message, "invalid_request_error", "permission_denied");
    case Status.NOT_FOUND:
      return new ApiError(404, message, "invalid_request_error", "not_found");
    case Status.INVALID_ARGUMENT:
    case Status.FAILED_PRECONDITION:
      return new ApiError(400, message);
    case Status.RESOURCE_EXHAUSTED:
      return new ApiError(429, message, "rate_limit_error", "rate_limit_exceeded");
    case Status.UNAVAILABLE:
      return new ApiError(503, message, "server_error", "unavailable");
    default:
      return new ApiError(500, message, "server_error");
  }
}

export const sendJson = (
  res: NodeServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
) => answer(res, status, { "content-type": "application/json", ...headers }, `${JSON.stringify(body)}\n`);

export const sendError = (res: NodeServerResponse, err: ApiError) =>
  sendJson(res, err.status, { error: { message: err.message, type: err.type, param: err.param, code: err.code } });

export async function readJson(req: NodeServerRequest, limit: number): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new ApiError(413, `the request body is over ${limit} bytes`);
    chunks.push(chunk);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new ApiError(400, "the request body is not JSON");
  }
  if (typeof body !== "object" || body === null || Array.isArray(body))
    throw new ApiError(400, "the request body must be a JSON object");
  return body as Record<string, unknown>;
}

/** The agent a model name picks. */
export function agentOf(model: unknown): string {
  if (typeof model !== "string" || model === "")
    throw new ApiError(400, "`model` is required", undefined, null, "model");
  const agent =
    model === "troupe" ? DEFAULT_AGENT : model.startsWith(MODEL_PREFIX) ? model.slice(MODEL_PREFIX.length) : "";
  if (!isAgentId(agent))
    throw new ApiError(
      404,
      `The model \`${model.slice(0, 100)}\` does not exist: use troupe/<agent>`,
      undefined,
      "model_not_found",
      "model",
    );
  return agent;
}

/** The request fields /v1/chat/completions acts on. */
const TAKEN = new Set([
  "model",
  "messages",
  "stream",
  "stream_options",
  "user",
  "tools",
  "tool_choice",
  "temperature",
  "max_tokens",
  "max_completion_tokens",
]);

/**
 * Fields that ask nothing when they hold their default: a client library may send them so.
 * Any other value of theirs is something a run cannot do.
 */
const DEFAULTS: Record<string, (v: unknown) => boolean> = {
  n: (v) => v === 1,
  top_p: (v) => v === 1,
  frequency_penalty: (v) => v === 0,
  presence_penalty: (v) => v === 0,
  logprobs: (v) => v === false,
  parallel_tool_calls: (v) => v === true,
  store: (v) => v === false,
  response_format: (v) => (v as { type?: unknown })?.type === "text",
  stop: (v) => Array.isArray(v) && v.length === 0,
  metadata: (v) => typeof v === "object" && v !== null && Object.keys(v).length === 0,
};

/**
 * Refuses the first field of `body` outside `taken` that asks for something (is neither null nor
 * at its default): a 400 naming it, as OpenAI answers an argument it does not know, never a
 * request quietly answered without it. `takes` says what a run does take, for the message.
 */
export function refuseUnsupported(
  body: Record<string, unknown>,
  taken: ReadonlySet<string>,
  defaults: Record<string, (v: unknown) => boolean>,
  takes: string,
): void {
  for (const [key, value] of Object.entries(body)) {
    if (taken.has(key) || value === null || value === undefined || defaults[key]?.(value)) continue;
    throw new ApiError(
      400,
      `\`${key.slice(0, 64)}\` is not supported here: a Troupe agent's run takes ${takes} from a request, and its agent.json the rest`,
      undefined,
      "unsupported_parameter",
      key.slice(0, 64),
    );
  }
}

/**
 * The run's temperature and reply length from a Chat Completions request (Prompt.sampling); any
 * other field that asks for something is refused (refuseUnsupported).
 */
export function samplingOf(body: Record<string, unknown>): { temperature?: number; maxOutputTokens?: number } {
  refuseUnsupported(body, TAKEN, DEFAULTS, "temperature and max_tokens (or max_completion_tokens)");
  const out: { temperature?: number; maxOutputTokens?: number } = {};
  const t = body.temperature;
  if (t !== undefined && t !== null) {
    if (typeof t !== "number" || !(t >= 0 && t <= 2))
      throw new ApiError(400, "`temperature` must be a number from 0 to 2", undefined, null, "temperature");
    out.temperature = t;
  }
  for (const key of ["max_completion_tokens", "max_tokens"] as const) {
    const n = body[key];
    if (n === undefined || n === null || out.maxOutputTokens !== undefined) continue;
    if (!Number.isInteger(n) || (n as number) < 1 || (n as number) > 1_000_000)
      throw new ApiError(400, `\`${key}\` must be an integer from 1 to 1000000`, undefined, null, key);
    out.maxOutputTokens = n as number;
  }
  return out;
}
