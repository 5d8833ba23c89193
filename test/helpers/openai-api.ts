// A Chat Completions server that checks each request the way the provider's API does, written from
// the published references, not from what Troupe sends. The scripted model server accepts anything;
// this one refuses what the real API refuses, in the real API's error shapes, so a test through it
// meets the failures a user meets first.
//
// Flavours and their sources:
// - "openai": https://platform.openai.com/docs/api-reference/chat/create (the request body, the
//   chunk object, stream_options, tool message pairing), https://platform.openai.com/docs/guides/reasoning
//   (reasoning models: max_completion_tokens, reasoning_effort, no sampling parameters; errors
//   `unsupported_parameter` / `unsupported_value`), https://platform.openai.com/docs/guides/error-codes
//   (401 invalid_api_key, 404 model_not_found, 429 with retry-after, 503 overloaded).
// - "ollama": https://github.com/ollama/ollama/blob/main/docs/openai.md (no key needed; max_tokens
//   is read, fields it does not know are ignored, so max_completion_tokens would not cap a reply).
import type http from "node:http";
import { ApiServer } from "./api-server.js";
import { checkMessages, checkTools, KNOWN_PARAMETERS, type ApiError } from "./openai-checks.js";

export interface ApiModel {
  id: string;
  /** Reasoning models (o series, gpt-5): the reasoning guide's rules apply. */
  efforts?: readonly string[];
  /** false: refuses image inputs, as models without vision do. */
  vision?: boolean;
  /** Its Model object's shutdown_date (YYYY-MM-DD): the day OpenAI stops serving it. */
  shutdownDate?: string;
}

export const OPENAI_MODELS: readonly ApiModel[] = [
  { id: "gpt-4.1-mini" },
  { id: "gpt-4o-mini" },
  // Shut down on Dec 11, 2026 (developers.openai.com/api/docs/deprecations, "gpt-5-mini,
  // gpt-5-mini-2025-08-07", announced Jun 11, 2026).
  { id: "gpt-5-mini", efforts: ["minimal", "low", "medium", "high"], shutdownDate: "2026-12-11" },
  // The API reference's ReasoningEffort: gpt-5.1 takes none to high, not minimal; gpt-5-pro high only.
  { id: "gpt-5.1", efforts: ["none", "low", "medium", "high"] },
  { id: "gpt-5-pro", efforts: ["high"] },
  // A chat model of the gpt-5.1 family: no reasoning, so no reasoning_effort.
  { id: "gpt-5.1-chat-latest" },
  { id: "o4-mini", efforts: ["low", "medium", "high"] },
];

/**
 * OpenAI's GET /v1/models/{model} (developers.openai.com/api/reference/resources/models/methods/
 * retrieve), as both OpenAI servers answer it: the Model object, its shutdown_date null unless one
 * is announced; a model not served is 404 model_not_found, in the words the chat endpoint uses.
 */
export function describeModel(
  res: http.ServerResponse,
  url: string,
  models: readonly ApiModel[],
  notFound: (error: ApiError) => unknown,
): unknown {
  const id = decodeURIComponent(url.slice("/v1/models/".length));
  const model = models.find((m) => m.id === id);
  if (!model)
    return notFound({
      message: `The model \`${id}\` does not exist or you do not have access to it.`,
      type: "invalid_request_error",
      param: null,
      code: "model_not_found",
    });
  const shutdown_date = model.shutdownDate ?? null;
  res.writeHead(200, { "content-type": "application/json" });
  res.end(JSON.stringify({ id, object: "model", created: 1686935002, owned_by: "openai", shutdown_date }));
}

/** What the model answers to one accepted request. */
export type ApiReply = { text: string } | { toolCalls: { name: string; arguments: Record<string, unknown> }[] };

export interface ApiServerOptions {
  flavour: "openai" | "ollama";
  /** The key a request must carry (openai flavour). */
  apiKey?: string;
  models?: readonly ApiModel[];
  /** The answer to the n-th accepted request (default: "ok"). */
  reply?: (body: ChatBody, n: number) => ApiReply;
}

export type ChatBody = Record<string, unknown> & { model: string; messages: Record<string, unknown>[] };

export class ChatApiServer extends ApiServer {
  /** Bodies of the requests answered, in order. */
  readonly accepted: ChatBody[] = [];
  /** While set, every request gets this status (503: overloaded, 429: rate limited) with Retry-After. */
  outage?: { status: 429 | 503; retryAfterSeconds: number };
  /** The pause between a streamed reply's events, as a model generating them takes; 0: all at once. */
  eventGapMs = 0;
  constructor(private readonly options: ApiServerOptions) {
    super();
  }

  protected handle(req: http.IncomingMessage, text: string, res: http.ServerResponse): unknown {
    const openai = this.options.flavour === "openai";
    const describing = openai && req.method === "GET" && req.url?.startsWith("/v1/models/");
    if (!describing && (req.method !== "POST" || req.url !== "/v1/chat/completions"))
      return this.refuse(res, 404, apiError(`Invalid URL (${req.method} ${req.url})`, null, null));
    if (openai && req.headers.authorization !== `Bearer ${this.options.apiKey}`)
      return this.refuse(res, 401, {
        ...apiError("Incorrect API key provided.", null, "invalid_api_key"),
      });
    if (this.outage) {
      const { status, retryAfterSeconds } = this.outage;
      const error =
        status === 429
          ? { ...apiError("Rate limit reached for requests.", null, "rate_limit_exceeded"), type: "requests" }
          : { ...apiError("The server is overloaded or not ready yet.", null, null), type: "server_error" };
      return this.refuse(res, status, error, { "retry-after": String(retryAfterSeconds) });
    }
    if (describing)
      return describeModel(res, req.url!, this.options.models ?? OPENAI_MODELS, (error) =>
        this.refuse(res, 404, error),
      );
    let body: ChatBody;
    try {
      body = JSON.parse(text);
    } catch {
      return this.refuse(res, 400, apiError("We could not parse the JSON body of your request.", null, null));
    }
    const problem = openai ? this.checkOpenAI(body) : this.checkOllama(body);
    if (problem) return this.refuse(res, problem.status, problem.error);
    const n = this.accepted.push(body) - 1;
    this.answer(res, body, this.options.reply?.(body, n) ?? { text: "ok" });
  }

  private findModel(id: unknown): ApiModel | undefined {
    return (this.options.models ?? OPENAI_MODELS).find((m) => m.id === id);
  }

  private checkOpenAI(body: ChatBody): { status: number; error: ApiError } | undefined {
    const bad = (error: ApiError, status = 400) => ({ status, error });
    for (const key of Object.keys(body))
      if (!KNOWN_PARAMETERS.has(key))
        return bad(apiError(`Unrecognized request argument supplied: ${key}`, null, null));
    if (typeof body.model !== "string") return bad(apiError("you must provide a model parameter", null, null));
    const model = this.findModel(body.model);
    if (!model)
      return bad(
        apiError(
          `The model \`${body.model}\` does not exist or you do not have access to it.`,
          null,
          "model_not_found",
        ),
        404,
      );
    const messages = checkMessages(body.messages);
    if (messages) return bad(messages);
    const tools = checkTools(body.tools);
    if (tools) return bad(tools);
    const images = checkImages(body.messages, model);
    if (images) return bad(images);
    const format = body.response_format as { type?: string } | undefined;
    if (format?.type === "json_object" && !/json/i.test(JSON.stringify(body.messages)))
      return bad(
        apiError(
          "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
          "messages",
          null,
        ),
      );
    if (body.stream_options !== undefined && body.stream !== true)
      return bad(
        apiError("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options", null),
      );
    for (const field of ["max_tokens", "max_completion_tokens"])
      if (body[field] !== undefined && !(Number.isInteger(body[field]) && (body[field] as number) >= 1))
        return bad(apiError(`Invalid '${field}': expected an integer of at least 1.`, field, "invalid_value"));
    if (typeof body.temperature === "number" && (body.temperature < 0 || body.temperature > 2))
      return bad(apiError("Invalid 'temperature': must be between 0 and 2.", "temperature", "invalid_value"));
    if (model.efforts) {
      if (body.max_tokens !== undefined)
        return bad(
          apiError(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "max_tokens",
            "unsupported_parameter",
          ),
        );
      for (const field of ["temperature", "top_p"])
        if (body[field] !== undefined && body[field] !== 1)
          return bad(
            apiError(
              `Unsupported value: '${field}' does not support ${body[field]} with this model. Only the default (1) value is supported.`,
              field,
              "unsupported_value",
            ),
          );
      for (const field of ["presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias"])
        if (body[field] !== undefined)
          return bad(
            apiError(
              `Unsupported parameter: '${field}' is not supported with this model.`,
              field,
              "unsupported_parameter",
            ),
          );
      if (body.reasoning_effort !== undefined && !model.efforts.includes(String(body.reasoning_effort)))
        return bad(
          apiError(
            `Unsupported value: 'reasoning_effort' does not support '${body.reasoning_effort}' with this model. Supported values are: ${model.efforts.map((e) => `'${e}'`).join(", ")}.`,
            "reasoning_effort",
            "unsupported_value",
          ),
        );
    } else if (body.reasoning_effort !== undefined)
      return bad(
        apiError(
          "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
          "reasoning_effort",
          "unsupported_parameter",
        ),
      );
    return undefined;
  }

  private checkOllama(body: ChatBody): { status: number; error: ApiError } | undefined {
    if (!this.findModel(body.model))
      return { status: 404, error: apiError(`model "${body.model}" not found, try pulling it first`, null, null) };
    const messages = checkMessages(body.messages);
    return messages ? { status: 400, error: messages } : undefined;
  }

  /**
   * The answer in the documented shapes: a `chat.completion` object, or when streamed the
   * `chat.completion.chunk` events (role, content or tool call deltas, finish_reason, the usage
   * chunk with no choices when stream_options.include_usage) and `[DONE]`.
   */
  private answer(res: http.ServerResponse, body: ChatBody, reply: ApiReply): void {
    // The reply's cap: max_completion_tokens at OpenAI; Ollama reads only max_tokens.
    const capFields = this.options.flavour === "openai" ? ["max_completion_tokens", "max_tokens"] : ["max_tokens"];
    const cap = capFields.map((f) => body[f]).find((v) => typeof v === "number") as number | undefined;
    const head = {
      id: `chatcmpl-${Math.random().toString(36).slice(2, 14)}`,
      created: Math.floor(Date.now() / 1000),
      model: body.model,
      system_fingerprint: "fp_conformance",
    };
    let words: string[] = [];
    let finish = "stop";
    const calls =
      "toolCalls" in reply
        ? reply.toolCalls.map((c) => ({
            id: `call_${Math.random().toString(36).slice(2, 12)}`,
            type: "function",
            function: { name: c.name, arguments: JSON.stringify(c.arguments) },
          }))
        : [];
    if ("text" in reply) {
      const all = reply.text.split(" ");
      words = cap !== undefined && cap < all.length ? all.slice(0, cap) : all;
      if (words.length < all.length) finish = "length";
    } else finish = "tool_calls";
    const prompt = JSON.stringify(body.messages).length >> 2;
    const completion = words.length + calls.reduce((n, c) => n + Math.ceil(c.function.arguments.length / 4), 0);
    const usage = {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      prompt_tokens_details: { cached_tokens: 0 },
      completion_tokens_details: { reasoning_tokens: this.findModel(body.model)?.efforts ? 16 : 0 },
    };
    const content = words.length > 0 ? words.join(" ") : null;
    if (body.stream !== true) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          ...head,
          object: "chat.completion",
          choices: [
            {
              index: 0,
              message: { role: "assistant", content, refusal: null, ...(calls.length ? { tool_calls: calls } : {}) },
              logprobs: null,
              finish_reason: finish,
            },
          ],
          usage,
        }),
      );
      return;
    }
    const chunk = (delta: object, finishReason: string | null) => ({
      ...head,
      object: "chat.completion.chunk",
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    });
    const events: object[] = [chunk({ role: "assistant", content: "" }, null)];
    for (const [i, w] of words.entries()) events.push(chunk({ content: i === 0 ? w : ` ${w}` }, null));
    calls.forEach((call, index) => {
      const args = call.function.arguments;
      events.push(
        chunk(
          {
            tool_calls: [
              { index, id: call.id, type: "function", function: { name: call.function.name, arguments: "" } },
            ],
          },
          null,
        ),
      );
      for (let at = 0; at < args.length; at += 8)
        events.push(chunk({ tool_calls: [{ index, function: { arguments: args.slice(at, at + 8) } }] }, null));
    });
    events.push(chunk({}, finish));
    if ((body.stream_options as { include_usage?: boolean } | undefined)?.include_usage)
      events.push({ ...head, object: "chat.completion.chunk", choices: [], usage });
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const gap = this.eventGapMs;
    if (gap === 0) {
      for (const e of events) res.write(`data: ${JSON.stringify(e)}\n\n`);
      this.endStream(res, "data: [DONE]\n\n");
      return;
    }
    const next = (i: number) => {
      if (res.destroyed) return;
      if (i === events.length) return this.endStream(res, "data: [DONE]\n\n");
      res.write(`data: ${JSON.stringify(events[i])}\n\n`);
      setTimeout(next, gap, i + 1);
    };
    next(0);
  }
}

export const apiError = (message: string, param: string | null, code: string | null): ApiError => ({
  message,
  type: "invalid_request_error",
  param,
  code,
});

/** The formats the vision guide lists, by their first bytes (the API decodes what it is sent). */
function imageFormat(bytes: Buffer): string | undefined {
  if (bytes.subarray(0, 4).toString("hex") === "89504e47") return "png";
  if (bytes.subarray(0, 3).toString("hex") === "ffd8ff") return "jpeg";
  if (bytes.subarray(0, 4).toString("latin1") === "GIF8") return "gif";
  if (bytes.subarray(0, 4).toString("latin1") === "RIFF" && bytes.subarray(8, 12).toString("latin1") === "WEBP")
    return "webp";
  return undefined;
}

/** Image parts: only for models with vision; a data URL must hold a PNG, JPEG, GIF or WebP. */
function checkImages(messages: ChatBody["messages"], model: ApiModel): ApiError | undefined {
  for (const [i, m] of messages.entries()) {
    if (!Array.isArray(m.content)) continue;
    for (const [j, p] of (m.content as { type: string; image_url?: { url: string } }[]).entries()) {
      if (p.type !== "image_url") continue;
      if (model.vision === false)
        return apiError(
          "Invalid content type. image_url is only supported by certain models.",
          `messages.[${i}].content.[${j}].type`,
          null,
        );
      const data = /^data:image\/[a-z]+;base64,([A-Za-z0-9+/=]+)$/.exec(p.image_url!.url);
      if (data && !imageFormat(Buffer.from(data[1]!, "base64")))
        return apiError(
          "You uploaded an unsupported image. Please make sure your image has of one the following formats: ['png', 'jpeg', 'gif', 'webp'].",
          null,
          "invalid_image_format",
        );
    }
  }
  return undefined;
}
