// A Responses API server that checks each request as OpenAI's does, written from the references:
// https://platform.openai.com/docs/api-reference/responses/create (the request body, input item
// shapes), https://platform.openai.com/docs/api-reference/responses-streaming (the events), and
// https://platform.openai.com/docs/guides/reasoning (reasoning models: no sampling parameters,
// reasoning.effort, and "keeping reasoning items in context": with store false a reasoning item can
// only come back with its encrypted_content, asked for by include). One check is stricter than the
// real API, on purpose: a function call's output sent without the reasoning item that came with the
// call is refused, because the guide says to send it and silence would hide a model that lost its
// reasoning mid-task.
import type http from "node:http";
import { ApiServer } from "./api-server.js";
import { OPENAI_MODELS, apiError, describeModel, type ApiModel } from "./openai-api.js";
import type { ApiError } from "./openai-checks.js";

/** What the model answers to one accepted request. */
export type ResponsesReply = { text: string } | { calls: { name: string; arguments: Record<string, unknown> }[] };
export type ResponsesBody = Record<string, unknown> & { model: string; input: Record<string, unknown>[] };

const KNOWN = new Set(
  "model input instructions tools tool_choice stream stream_options store include max_output_tokens max_tool_calls reasoning temperature top_p top_logprobs parallel_tool_calls previous_response_id conversation metadata text truncation user safety_identifier prompt_cache_key service_tier background prompt".split(
    " ",
  ),
);
const INCLUDABLE = new Set(["reasoning.encrypted_content", "message.output_text.logprobs", "file_search_call.results"]);

export class ResponsesApiServer extends ApiServer {
  readonly accepted: ResponsesBody[] = [];
  /** Reasoning items this server issued: id -> encrypted content, and the call ids each came with. */
  private readonly issued = new Map<string, { encrypted: string; calls: string[] }>();
  private n = 0;

  constructor(
    private readonly options: {
      apiKey: string;
      models?: readonly ApiModel[];
      reply?: (body: ResponsesBody, n: number) => ResponsesReply;
    },
  ) {
    super();
  }

  protected handle(req: http.IncomingMessage, text: string, res: http.ServerResponse): unknown {
    const refuse = (status: number, error: ApiError) => this.refuse(res, status, error);
    const describing = req.method === "GET" && req.url?.startsWith("/v1/models/");
    if (!describing && (req.method !== "POST" || req.url !== "/v1/responses"))
      return refuse(404, apiError(`Invalid URL (${req.method} ${req.url})`, null, null));
    if (req.headers.authorization !== `Bearer ${this.options.apiKey}`)
      return refuse(401, apiError("Incorrect API key provided.", null, "invalid_api_key"));
    if (describing) return describeModel(res, req.url!, this.options.models ?? OPENAI_MODELS, (e) => refuse(404, e));
    let body: ResponsesBody;
    try {
      body = JSON.parse(text);
    } catch {
      return refuse(400, apiError("We could not parse the JSON body of your request.", null, null));
    }
    const problem = this.check(body);
    if (problem) return refuse(problem.status, problem.error);
    const n = this.accepted.push(body) - 1;
    this.answer(res, body, this.options.reply?.(body, n) ?? { text: "ok" });
  }

  private check(body: ResponsesBody): { status: number; error: ApiError } | undefined {
    const bad = (message: string, param: string | null, code: string | null, status = 400) => ({
      status,
      error: apiError(message, param, code),
    });
    for (const key of Object.keys(body))
      if (!KNOWN.has(key)) return bad(`Unknown parameter: '${key}'.`, key, "unknown_parameter");
    const model = (this.options.models ?? OPENAI_MODELS).find((m) => m.id === body.model);
    if (!model)
      return bad(
        `The model \`${body.model}\` does not exist or you do not have access to it.`,
        null,
        "model_not_found",
        404,
      );
    if (
      body.max_output_tokens !== undefined &&
      !(Number.isInteger(body.max_output_tokens) && (body.max_output_tokens as number) >= 16)
    )
      return bad(
        "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16.",
        "max_output_tokens",
        "integer_below_min_value",
      );
    for (const inc of (body.include as string[] | undefined) ?? [])
      if (!INCLUDABLE.has(inc)) return bad(`Invalid value: '${inc}'.`, "include", "invalid_value");
    const effort = (body.reasoning as { effort?: string } | undefined)?.effort;
    if (model.efforts) {
      for (const field of ["temperature", "top_p"])
        if (body[field] !== undefined)
          return bad(
            `Unsupported parameter: '${field}' is not supported with this model.`,
            field,
            "unsupported_parameter",
          );
      if (effort !== undefined && !model.efforts.includes(effort))
        return bad(
          `Unsupported value: 'reasoning.effort' does not support '${effort}' with this model.`,
          "reasoning.effort",
          "unsupported_value",
        );
    } else if (body.reasoning !== undefined)
      return bad(
        "Unsupported parameter: 'reasoning.effort' is not supported with this model.",
        "reasoning.effort",
        "unsupported_parameter",
      );
    if (!Array.isArray(body.input))
      return bad("Invalid type for 'input': expected a string or an array.", "input", "invalid_type");
    return this.checkItems(body, bad);
  }

  private checkItems(
    body: ResponsesBody,
    bad: (message: string, param: string | null, code: string | null) => { status: number; error: ApiError },
  ) {
    const calls = new Set<string>();
    const answered = new Set<string>();
    const reasoningSeen = new Set<string>();
    for (const [i, item] of body.input.entries()) {
      const at = `input[${i}]`;
      if (item.type === "function_call") {
        if (typeof item.call_id !== "string" || typeof item.name !== "string" || typeof item.arguments !== "string")
          return bad(
            `Missing required parameter: '${at}.call_id', '${at}.name' or '${at}.arguments'.`,
            at,
            "missing_required_parameter",
          );
        calls.add(item.call_id);
      } else if (item.type === "function_call_output") {
        if (!calls.has(String(item.call_id)))
          return bad(`No tool call found for function call output with call_id ${item.call_id}.`, "input", null);
        if (typeof item.output !== "string")
          return bad(`Invalid type for '${at}.output'.`, `${at}.output`, "invalid_type");
        answered.add(String(item.call_id));
        // Stricter than the API (see the top): the call's reasoning must have come back with it.
        for (const [id, r] of this.issued)
          if (r.calls.includes(String(item.call_id)) && !reasoningSeen.has(id))
            return bad(
              `The reasoning item ${id} that came with call ${item.call_id} was not sent back.`,
              "input",
              "missing_reasoning_item",
            );
      } else if (item.type === "reasoning") {
        const issued = this.issued.get(String(item.id));
        if (!issued || typeof item.encrypted_content !== "string")
          return bad(
            `Item with id '${item.id}' not found. Items are not persisted when \`store\` is set to false. Try again with \`store\` set to true, or remove this item from your input.`,
            "input",
            null,
          );
        if (issued.encrypted !== item.encrypted_content)
          return bad(
            `The encrypted content for item ${item.id} could not be verified.`,
            "input",
            "invalid_encrypted_content",
          );
        reasoningSeen.add(String(item.id));
      } else if (item.type === undefined || item.type === "message") {
        if (!["user", "assistant", "system", "developer"].includes(String(item.role)))
          return bad(
            `Invalid value: '${item.role}'. Supported values are: 'user', 'assistant', 'system', and 'developer'.`,
            `${at}.role`,
            "invalid_value",
          );
        if (typeof item.content !== "string" && !Array.isArray(item.content))
          return bad(`Invalid type for '${at}.content'.`, `${at}.content`, "invalid_type");
      } else return bad(`Invalid value: '${item.type}'.`, `${at}.type`, "invalid_value");
    }
    for (const id of calls)
      if (!answered.has(id)) return bad(`No tool output found for function call ${id}.`, "input", null);
    return undefined;
  }

  /** The streaming events of the reference, in order, ending with response.completed or .incomplete. */
  private answer(res: http.ServerResponse, body: ResponsesBody, reply: ResponsesReply): void {
    const id = `resp_${++this.n}`;
    const model = (this.options.models ?? OPENAI_MODELS).find((m) => m.id === body.model)!;
    const events: Record<string, unknown>[] = [];
    const output: Record<string, unknown>[] = [];
    const emit = (type: string, rest: Record<string, unknown>) =>
      events.push({ type, sequence_number: events.length, ...rest });
    const response = (status: string, extra: Record<string, unknown> = {}) => ({
      id,
      object: "response",
      model: body.model,
      status,
      output,
      ...extra,
    });
    emit("response.created", { response: response("in_progress") });
    const callIds: string[] = [];
    let reasoningItem: Record<string, unknown> | undefined;
    if (model.efforts) {
      const rid = `rs_${this.n}`;
      const encrypted = `enc-${this.n}-${Math.random().toString(36).slice(2)}`;
      const wantsEncrypted = (body.include as string[] | undefined)?.includes("reasoning.encrypted_content");
      reasoningItem = {
        type: "reasoning",
        id: rid,
        summary: [],
        ...(wantsEncrypted ? { encrypted_content: encrypted } : {}),
      };
      this.issued.set(rid, { encrypted: wantsEncrypted ? encrypted : "", calls: callIds });
      output.push(reasoningItem);
      emit("response.output_item.added", { output_index: 0, item: { ...reasoningItem, encrypted_content: undefined } });
      emit("response.output_item.done", { output_index: 0, item: reasoningItem });
    }
    let status = "completed";
    if ("text" in reply) {
      const words = reply.text.split(" ");
      const cap = typeof body.max_output_tokens === "number" ? body.max_output_tokens : Number.POSITIVE_INFINITY;
      const kept = words.slice(0, cap);
      if (kept.length < words.length) status = "incomplete";
      const index = output.length;
      const item = {
        type: "message",
        id: `msg_${this.n}`,
        role: "assistant",
        status: "completed",
        content: [{ type: "output_text", text: kept.join(" "), annotations: [] }],
      };
      emit("response.output_item.added", { output_index: index, item: { ...item, content: [] } });
      for (const [k, w] of kept.entries())
        emit("response.output_text.delta", {
          item_id: item.id,
          output_index: index,
          content_index: 0,
          delta: k === 0 ? w : ` ${w}`,
        });
      emit("response.output_item.done", { output_index: index, item });
      output.push(item);
    } else
      for (const call of reply.calls) {
        const index = output.length;
        const callId = `call_${this.n}_${index}`;
        callIds.push(callId);
        const args = JSON.stringify(call.arguments);
        const item = {
          type: "function_call",
          id: `fc_${this.n}_${index}`,
          call_id: callId,
          name: call.name,
          arguments: args,
          status: "completed",
        };
        emit("response.output_item.added", { output_index: index, item: { ...item, arguments: "" } });
        for (let at = 0; at < args.length; at += 8)
          emit("response.function_call_arguments.delta", {
            item_id: item.id,
            output_index: index,
            delta: args.slice(at, at + 8),
          });
        emit("response.output_item.done", { output_index: index, item });
        output.push(item);
      }
    const usage = {
      input_tokens: JSON.stringify(body.input).length >> 2,
      output_tokens: 12,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens_details: { reasoning_tokens: model.efforts ? 8 : 0 },
    };
    emit(status === "completed" ? "response.completed" : "response.incomplete", {
      response: response(status, {
        usage,
        ...(status === "incomplete" ? { incomplete_details: { reason: "max_output_tokens" } } : {}),
      }),
    });
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const sse = events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`);
    for (const e of sse.slice(0, -1)) res.write(e);
    this.endStream(res, sse[sse.length - 1]);
  }
}
