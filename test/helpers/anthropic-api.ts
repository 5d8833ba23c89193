// A Messages API server that checks each request as Anthropic's does, written from the references:
// https://docs.anthropic.com/en/api/messages (headers, the body, content blocks, tool_use and
// tool_result pairing), https://docs.anthropic.com/en/api/messages-streaming (the events) and
// https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking (budget_tokens of at least
// 1024 and below max_tokens, and while tool use goes on the assistant turn's thinking block must
// come back first, with its signature unchanged). The body's fields are those of the API version
// Troupe sends (2026-10-21: MessageCreateParams in @anthropic-ai/sdk 1.13), which has no
// sampling parameters; output_config.effort takes low, medium, high, xhigh or max. Which kind of
// thinking each model takes is in MODELS below, from
// https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking (and Amazon Bedrock's
// copy, docs.aws.amazon.com/bedrock/latest/userguide/claude-messages-adaptive-thinking.html):
// Opus 4.7 takes adaptive thinking only, and a budget is a 400 there; Sonnet 4.6 takes both (the
// budget deprecated); Sonnet 4.5, Opus 4.5 and Haiku 4.5 take a budget only. The effort parameter
// (.../build-with-claude/effort) came with Opus 4.5: Sonnet 4.5 and Haiku 4.5 refuse it. A
// thinking config's display is summarized or omitted (ThinkingConfigAdaptive.display in the SDK;
// .../build-with-claude/thinking#controlling-thinking-display); Opus 4.7 omits by default.
import type http from "node:http";
import { ApiServer } from "./api-server.js";
import type { ApiError } from "./openai-checks.js";

export type AnthropicReply = { text: string } | { calls: { name: string; input: Record<string, unknown> }[] };
export type AnthropicBody = Record<string, unknown> & { model: string; messages: { role: string; content: unknown }[] };
type Block = Record<string, unknown>;

const KNOWN = new Set(
  "model messages max_tokens system metadata stop_sequences stream tools tool_choice thinking service_tier container cache_control diagnostics inference_geo output_config speed user_profile_id workspace_id".split(
    " ",
  ),
);
const EFFORTS = ["low", "medium", "high", "xhigh", "max"];

/** The models this server serves, and what each takes: thinking.type "adaptive", "enabled" (a budget), output_config.effort. */
const MODELS: Record<string, { adaptive: boolean; budget: boolean; effort: boolean; display?: "omitted" }> = {
  // Its thinking's display is omitted unless asked for (the SDK's ThinkingConfigAdaptive.display).
  "claude-opus-4-7": { adaptive: true, budget: false, effort: true, display: "omitted" },
  "claude-sonnet-4-6": { adaptive: true, budget: true, effort: true },
  "claude-opus-4-5": { adaptive: false, budget: true, effort: true },
  "claude-sonnet-4-5": { adaptive: false, budget: true, effort: false },
  "claude-haiku-4-5": { adaptive: false, budget: true, effort: false },
};
const thinks = (body: Record<string, unknown>) =>
  ["enabled", "adaptive"].includes(String((body.thinking as { type?: string } | undefined)?.type));

const error = (type: string, message: string): ApiError => ({ type, message, param: null, code: null });

export class AnthropicApiServer extends ApiServer {
  readonly accepted: AnthropicBody[] = [];
  /** The thinking text each signature this server gave out was given for. */
  private readonly signatures = new Map<string, string>();
  private n = 0;

  constructor(
    private readonly options: {
      apiKey: string;
      models?: readonly string[];
      reply?: (body: AnthropicBody, n: number) => AnthropicReply;
    },
  ) {
    super();
  }

  protected handle(req: http.IncomingMessage, text: string, res: http.ServerResponse): unknown {
    // Anthropic's errors are {"type": "error", "error": {"type", "message"}}.
    const refuse = (status: number, type: string, message: string) => {
      this.refused.push({ status, error: error(type, message) });
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify({ type: "error", error: { type, message } }));
    };
    const describing = req.method === "GET" && req.url?.startsWith("/v1/models/");
    if (!describing && (req.method !== "POST" || req.url !== "/v1/messages"))
      return refuse(404, "not_found_error", "Not found");
    // The key as x-api-key, or (what the current SDK sends) as a bearer token.
    const key = req.headers["x-api-key"] ?? req.headers.authorization?.replace(/^Bearer /, "");
    if (key !== this.options.apiKey) return refuse(401, "authentication_error", "invalid x-api-key");
    if (!req.headers["anthropic-version"])
      return refuse(400, "invalid_request_error", "anthropic-version: header is required");
    if (describing) {
      // GET /v1/models/{model_id} (platform.claude.com/docs/en/api/models/retrieve): a ModelInfo,
      // which has no retirement day; a model not served is the Messages API's 404.
      const id = decodeURIComponent(req.url!.slice("/v1/models/".length));
      if (!this.serves(id)) return refuse(404, "not_found_error", `model: ${id}`);
      res.writeHead(200, { "content-type": "application/json" });
      const name = id.replace(
        /^claude-(\w)(\w+)-(\d+)-(\d+)$/,
        (_, a, b, major, minor) => `Claude ${a.toUpperCase()}${b} ${major}.${minor}`,
      );
      return res.end(JSON.stringify({ id, type: "model", display_name: name, created_at: "2025-01-01T00:00:00Z" }));
    }
    let body: AnthropicBody;
    try {
      body = JSON.parse(text);
    } catch {
      return refuse(400, "invalid_request_error", "The request body is not valid JSON.");
    }
    const problem = this.check(body);
    if (problem) return refuse(problem.status, problem.type, problem.message);
    const n = this.accepted.push(body) - 1;
    this.answer(res, body, this.options.reply?.(body, n) ?? { text: "ok" });
  }

  private serves(model: string): boolean {
    return Object.hasOwn(MODELS, model) && (this.options.models ?? Object.keys(MODELS)).includes(model);
  }

  private check(body: AnthropicBody): { status: number; type: string; message: string } | undefined {
    const bad = (message: string, status = 400, type = "invalid_request_error") => ({ status, type, message });
    for (const key of Object.keys(body)) if (!KNOWN.has(key)) return bad(`${key}: Extra inputs are not permitted`);
    const model = MODELS[body.model];
    if (!this.serves(body.model)) return bad(`model: ${body.model}`, 404, "not_found_error");
    if (!Number.isInteger(body.max_tokens) || (body.max_tokens as number) < 1) return bad("max_tokens: Field required");
    const thinking = body.thinking as { type?: string; budget_tokens?: number } | undefined;
    if (thinking !== undefined && !["enabled", "adaptive", "disabled"].includes(String(thinking.type)))
      return bad("thinking.type: Input should be 'enabled', 'adaptive' or 'disabled'");
    if (thinking?.type === "enabled") {
      if (!model.budget)
        return bad(
          `thinking.type.enabled is not supported for ${body.model}. Use thinking.type.adaptive and output_config.effort to control thinking behavior.`,
        );
      const budget = thinking.budget_tokens ?? 0;
      if (budget < 1024) return bad("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024");
      if (budget >= (body.max_tokens as number))
        return bad("`max_tokens` must be greater than `thinking.budget_tokens`.");
    }
    if (thinking?.type === "adaptive") {
      if (!model.adaptive)
        return bad(
          `adaptive thinking is not supported for ${body.model}: use thinking.type.enabled with budget_tokens`,
        );
      if ("budget_tokens" in thinking) return bad("thinking.adaptive.budget_tokens: Extra inputs are not permitted");
    }
    const display = (thinking as { display?: unknown } | undefined)?.display;
    if (display !== undefined && display !== null && display !== "summarized" && display !== "omitted")
      return bad(`thinking.${thinking?.type}.display: Input should be 'summarized' or 'omitted'`);
    const cache = body.cache_control as { type?: string; ttl?: string } | null | undefined;
    if (cache && (cache.type !== "ephemeral" || (cache.ttl !== undefined && !["5m", "1h"].includes(cache.ttl))))
      return bad("cache_control: Input should be {'type': 'ephemeral', 'ttl': '5m' | '1h'}");
    const effort = (body.output_config as { effort?: string } | undefined)?.effort;
    if (effort !== undefined && !EFFORTS.includes(effort))
      return bad(`output_config.effort: Input should be ${EFFORTS.map((x) => `'${x}'`).join(", ")}`);
    if (effort !== undefined && !model.effort)
      return bad(`output_config.effort: the effort parameter is not supported for ${body.model}`);
    for (const t of (body.tools as Block[] | undefined) ?? [])
      if (
        typeof t.name !== "string" ||
        !/^[a-zA-Z0-9_-]{1,128}$/.test(t.name) ||
        (t.input_schema as Block)?.type !== "object"
      )
        return bad("tools: each tool needs a name matching ^[a-zA-Z0-9_-]{1,128}$ and an input_schema of type object");
    if (!Array.isArray(body.messages) || body.messages.length === 0)
      return bad("messages: at least one message is required");
    return this.checkMessages(body, thinks(body), bad);
  }

  private checkMessages(
    body: AnthropicBody,
    thinking: boolean,
    bad: (message: string) => { status: number; type: string; message: string },
  ) {
    let pending: Set<string> = new Set();
    for (const [i, m] of body.messages.entries()) {
      if (m.role !== "user" && m.role !== "assistant")
        return bad(
          `messages: Unexpected role "${m.role}". The Messages API accepts a top-level \`system\` parameter, not "system" as an input message role.`,
        );
      const blocks: Block[] =
        typeof m.content === "string" ? [{ type: "text", text: m.content }] : (m.content as Block[]);
      if (!Array.isArray(blocks)) return bad(`messages.${i}.content: Input should be a valid list`);
      const results = blocks.filter((b) => b.type === "tool_result").map((b) => String(b.tool_use_id));
      if (pending.size > 0) {
        const missing = [...pending].filter((id) => !results.includes(id));
        if (m.role !== "user" || missing.length > 0)
          return bad(
            `messages.${i - 1}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${missing.join(", ")}. Each \`tool_use\` block must have a corresponding \`tool_result\` block in the next message.`,
          );
      }
      const extra = results.filter((id) => !pending.has(id));
      if (extra.length > 0)
        return bad(
          `messages.${i}.content: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${extra.join(", ")}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`,
        );
      for (const [k, b] of blocks.entries()) {
        if (b.type === "text" && (typeof b.text !== "string" || b.text === ""))
          return bad(`messages.${i}.content.${k}.text: text content blocks must be non-empty`);
        if (b.type === "thinking" && this.signatures.get(String(b.signature)) !== b.thinking)
          return bad(`messages.${i}.content.${k}: Invalid \`signature\` in \`thinking\` block`);
        if (b.type === "image") {
          const problem = imageProblem(b.source as Block | undefined, m.role);
          if (problem) return bad(`messages.${i}.content.${k}.image.source${problem}`);
        }
      }
      pending = new Set(
        m.role === "assistant" ? blocks.filter((b) => b.type === "tool_use").map((b) => String(b.id)) : [],
      );
      // With thinking on, the assistant turn being answered with tool results must start with its thinking.
      const last = i === body.messages.length - 2 && m.role === "assistant" && pending.size > 0;
      if (thinking && last && blocks[0]?.type !== "thinking" && blocks[0]?.type !== "redacted_thinking")
        return bad(
          `messages.${i}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`${blocks[0]?.type}\`. When \`thinking\` is enabled, a final \`assistant\` message must start with a thinking block (preceeding the lastmost set of \`tool_use\` and \`tool_result\` blocks).`,
        );
    }
    if (pending.size > 0)
      return bad(
        `messages: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${[...pending].join(", ")}.`,
      );
    return undefined;
  }

  /** The reference's event stream: message_start, content blocks (start, deltas, stop), message_delta, message_stop. */
  private answer(res: http.ServerResponse, body: AnthropicBody, reply: AnthropicReply): void {
    const id = `msg_${++this.n}`;
    const events: Block[] = [
      {
        type: "message_start",
        message: {
          id,
          type: "message",
          role: "assistant",
          model: body.model,
          content: [],
          stop_reason: null,
          usage: {
            input_tokens: JSON.stringify(body.messages).length >> 2,
            output_tokens: 1,
            // A cached prefix is read back from the second request on (this server's stand-in for the cache).
            cache_read_input_tokens: body.cache_control && this.n > 1 ? 100 : 0,
          },
        },
      },
    ];
    let index = 0;
    if (thinks(body)) {
      // Where the display is omitted (Opus 4.7's default), the block comes with its signature and
      // no text, and goes back the same way.
      const display = (body.thinking as { display?: string }).display ?? MODELS[body.model].display;
      const thought = display === "omitted" ? "" : `thought ${this.n}`;
      const signature = `sig-${this.n}-${Math.random().toString(36).slice(2)}`;
      this.signatures.set(signature, thought);
      events.push(
        { type: "content_block_start", index, content_block: { type: "thinking", thinking: "", signature: "" } },
        ...(thought
          ? [{ type: "content_block_delta", index, delta: { type: "thinking_delta", thinking: thought } }]
          : []),
        { type: "content_block_delta", index, delta: { type: "signature_delta", signature } },
        { type: "content_block_stop", index },
      );
      index++;
    }
    let stop = "end_turn";
    if ("text" in reply) {
      const words = reply.text.split(" ");
      const kept = words.slice(0, body.max_tokens as number);
      if (kept.length < words.length) stop = "max_tokens";
      events.push({ type: "content_block_start", index, content_block: { type: "text", text: "" } });
      for (const [k, w] of kept.entries())
        events.push({ type: "content_block_delta", index, delta: { type: "text_delta", text: k === 0 ? w : ` ${w}` } });
      events.push({ type: "content_block_stop", index });
    } else {
      stop = "tool_use";
      for (const call of reply.calls) {
        const json = JSON.stringify(call.input);
        events.push({
          type: "content_block_start",
          index,
          content_block: { type: "tool_use", id: `toolu_${this.n}_${index}`, name: call.name, input: {} },
        });
        for (let at = 0; at < json.length; at += 8)
          events.push({
            type: "content_block_delta",
            index,
            delta: { type: "input_json_delta", partial_json: json.slice(at, at + 8) },
          });
        events.push({ type: "content_block_stop", index });
        index++;
      }
    }
    events.push(
      { type: "message_delta", delta: { stop_reason: stop, stop_sequence: null }, usage: { output_tokens: 12 } },
      { type: "message_stop" },
    );
    if (body.stream !== true) {
      // Not streamed: the same message, whole (its blocks assembled from the events above).
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(assembled(events)));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const sse = events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`);
    for (const e of sse.slice(0, -1)) res.write(e);
    this.endStream(res, sse[sse.length - 1]);
  }
}

/** The message a stream of events describes, as the non-streaming answer gives it. */
function assembled(events: Block[]): Block {
  const start = events[0].message as Block;
  const blocks: Block[] = [];
  let stop: unknown = null;
  for (const e of events) {
    if (e.type === "content_block_start") blocks[Number(e.index)] = { ...(e.content_block as Block) };
    else if (e.type === "content_block_delta") {
      const b = blocks[Number(e.index)];
      const d = e.delta as Block;
      if (d.type === "text_delta") b.text = `${b.text}${d.text}`;
      else if (d.type === "thinking_delta") b.thinking = `${b.thinking}${d.thinking}`;
      else if (d.type === "signature_delta") b.signature = `${b.signature}${d.signature}`;
      else if (d.type === "input_json_delta") b.partial = `${b.partial ?? ""}${d.partial_json}`;
    } else if (e.type === "message_delta") stop = (e.delta as Block).stop_reason;
  }
  for (const b of blocks) if (b.partial !== undefined) (b.input = JSON.parse(String(b.partial))), delete b.partial;
  return { ...start, content: blocks, stop_reason: stop };
}

/**
 * An image block's source, as https://docs.anthropic.com/en/docs/build-with-claude/vision says:
 * base64 with media_type image/jpeg, image/png, image/gif or image/webp (what the bytes are, the
 * API decodes them), at most 5 MB; or a url source. Images only in user turns.
 */
function imageProblem(source: Block | undefined, role: string): string | undefined {
  if (role !== "user") return ": images are only allowed in user messages";
  if (source?.type === "url") return typeof source.url === "string" ? undefined : ".url: Field required";
  if (source?.type !== "base64") return ".type: Input tag does not match any of the expected tags: 'base64', 'url'";
  const types = ["image/jpeg", "image/png", "image/gif", "image/webp"];
  if (!types.includes(String(source.media_type)))
    return `.base64.media_type: Input should be ${types.map((t) => `'${t}'`).join(", ")}`;
  const bytes = Buffer.from(String(source.data ?? ""), "base64");
  if (bytes.length > 5 * 1024 * 1024) return ": image exceeds 5 MB maximum";
  const magic: Record<string, (b: Buffer) => boolean> = {
    "image/png": (b) => b.subarray(0, 4).toString("hex") === "89504e47",
    "image/jpeg": (b) => b.subarray(0, 3).toString("hex") === "ffd8ff",
    "image/gif": (b) => b.subarray(0, 4).toString("latin1") === "GIF8",
    "image/webp": (b) => b.subarray(8, 12).toString("latin1") === "WEBP",
  };
  if (!magic[String(source.media_type)]!(bytes))
    return `: Image does not match the provided media type ${source.media_type}`;
  return undefined;
}
