// What a POST /v1/responses asks, in the terms the Chat Completions face already handles: its
// input items become chat messages (openai-history.ts reads them), its function tools client
// tools (openai-tools.ts), and its parameters the run's sampling or a 400 naming them. Shapes
// follow OpenAI's API reference: https://platform.openai.com/docs/api-reference/responses/create
// (input items: messages with input_text / input_image / output_text parts, function_call,
// function_call_output).
//
// A response id is a RunRef (run-events.ts) under the prefix `resp_`.
import { ApiError, refuseUnsupported, samplingOf } from "./openai-request.js";
import { clientToolsOf } from "./openai-tools.js";
import { type RunRef, runIdOf, runRefOf } from "./run-events.js";

export type ResponseRef = RunRef;
export const responseIdOf = (r: RunRef): string => runIdOf("resp_", r);
/** The response an id names; undefined for one this server did not make (a 404 to the caller). */
export const responseRefOf = (id: string): RunRef | undefined => runRefOf("resp_", id);

/** The request fields POST /v1/responses acts on (beside sampling, read by samplingOf). */
const TAKEN = new Set([
  "model",
  "input",
  "instructions",
  "previous_response_id",
  "store",
  "stream",
  "background",
  "tools",
  "tool_choice",
  "temperature",
  "max_output_tokens",
  // Who the end user is, for the provider's abuse monitoring: a run has nothing to do with it.
  "user",
  "safety_identifier",
]);

/** Fields a client library sends at their defaults, which ask nothing. */
const DEFAULTS: Record<string, (v: unknown) => boolean> = {
  include: (v) => Array.isArray(v) && v.length === 0,
  text: (v) => {
    const format = (v as { format?: { type?: unknown } })?.format;
    return typeof v === "object" && v !== null && (format === undefined || format?.type === "text");
  },
  truncation: (v) => v === "disabled",
  service_tier: (v) => v === "auto" || v === "default",
  metadata: (v) => typeof v === "object" && v !== null && Object.keys(v).length === 0,
  top_p: (v) => v === 1,
  parallel_tool_calls: (v) => v === true || v === false,
  reasoning: (v) => typeof v === "object" && v !== null && Object.values(v).every((x) => x === null),
};

export interface ResponsesRequest {
  /** The input as chat messages (system and developer first when `instructions` is given). */
  messages: Record<string, unknown>[];
  instructions: string | null;
  previous?: ResponseRef;
  previousId: string | null;
  store: boolean;
  stream: boolean;
  background: boolean;
  clientTools: ReturnType<typeof clientToolsOf>;
  /** The request's function tools as they came, for the response object. */
  tools: unknown[];
  sampling: ReturnType<typeof samplingOf>;
}

const bad = (message: string, param: string) => new ApiError(400, message, undefined, null, param);

/** A message item's content as chat content parts. */
function partsOf(content: unknown, at: string): unknown {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw bad(`${at}.content must be a string or an array of parts`, "input");
  return content.map((p: { type?: unknown; text?: unknown; image_url?: unknown; detail?: unknown }, i) => {
    if ((p?.type === "input_text" || p?.type === "output_text") && typeof p.text === "string")
      return { type: "text", text: p.text };
    if (p?.type === "input_image" && typeof p.image_url === "string")
      return { type: "image_url", image_url: { url: p.image_url } };
    throw bad(
      `${at}.content[${i}]: parts may be input_text, output_text or input_image with an image_url, not ${JSON.stringify(p?.type)}`,
      "input",
    );
  });
}

/** The input (a string, or items) as chat messages, in order. */
export function messagesOf(input: unknown): Record<string, unknown>[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  if (!Array.isArray(input) || input.length === 0)
    throw bad("`input` must be a string or a non-empty array of items", "input");
  if (input.length > 1000) throw bad("`input` holds at most 1000 items", "input");
  const out: Record<string, unknown>[] = [];
  input.forEach((item: Record<string, unknown>, i) => {
    const at = `input[${i}]`;
    const type = item?.type ?? (item?.role !== undefined ? "message" : undefined);
    if (type === "message") {
      const role = item.role;
      if (role !== "user" && role !== "assistant" && role !== "system" && role !== "developer")
        throw bad(`${at}.role must be user, assistant, system or developer`, "input");
      out.push({ role, content: partsOf(item.content, at) });
    } else if (type === "function_call") {
      if (typeof item.call_id !== "string" || typeof item.name !== "string" || typeof item.arguments !== "string")
        throw bad(`${at}: a function_call needs call_id, name and arguments (strings)`, "input");
      const call = { id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } };
      // Calls of one model turn are one assistant message, as Chat Completions has them.
      const last = out.at(-1);
      if (last?.role === "assistant" && Array.isArray(last.tool_calls) && !last.content)
        (last.tool_calls as unknown[]).push(call);
      else out.push({ role: "assistant", content: null, tool_calls: [call] });
    } else if (type === "function_call_output") {
      if (typeof item.call_id !== "string" || typeof item.output !== "string")
        throw bad(`${at}: a function_call_output needs call_id and output (strings)`, "input");
      out.push({ role: "tool", tool_call_id: item.call_id, content: item.output });
    } else
      throw bad(
        `${at}: items may be messages, function_call or function_call_output, not ${JSON.stringify(type)}`,
        "input",
      );
  });
  return out;
}

/** The request, checked; anything it asks that a run cannot do is a 400 naming it. */
export function responsesRequestOf(body: Record<string, unknown>): ResponsesRequest {
  refuseUnsupported(body, TAKEN, DEFAULTS, "input, instructions, temperature and max_output_tokens");
  if (body.user !== undefined && body.user !== null && (typeof body.user !== "string" || body.user.length > 256))
    throw bad("`user` must be a string of at most 256 characters", "user");
  const flag = (k: string, d: boolean) => {
    const v = body[k];
    if (v === undefined || v === null) return d;
    if (typeof v !== "boolean") throw bad(`\`${k}\` must be a boolean`, k);
    return v;
  };
  const store = flag("store", true);
  const background = flag("background", false);
  if (background && !store) throw bad("a background response must be stored (`store` cannot be false)", "store");
  const instructions = body.instructions ?? null;
  if (instructions !== null && typeof instructions !== "string")
    throw bad("`instructions` must be a string", "instructions");
  const previousId = body.previous_response_id ?? null;
  let previous: ResponseRef | undefined;
  if (previousId !== null) {
    if (typeof previousId !== "string") throw bad("`previous_response_id` must be a string", "previous_response_id");
    previous = responseRefOf(previousId);
    if (!previous)
      throw new ApiError(
        404,
        `Previous response with id '${previousId.slice(0, 100)}' not found.`,
        undefined,
        "previous_response_not_found",
        "previous_response_id",
      );
  }
  const tools = body.tools ?? [];
  if (!Array.isArray(tools)) throw bad("`tools` must be an array", "tools");
  const asChat = tools.map((t: Record<string, unknown>, i) => {
    if (t?.type !== "function")
      throw bad(
        `tools[${i}]: a Troupe agent's own tools run server-side; a request may add function tools only, not ${JSON.stringify(t?.type)}`,
        "tools",
      );
    return { type: "function", function: { name: t.name, description: t.description, parameters: t.parameters } };
  });
  const clientTools = clientToolsOf({ tools: asChat.length > 0 ? asChat : undefined, tool_choice: body.tool_choice });
  const sampling = samplingOf({
    temperature: body.temperature,
    ...(body.max_output_tokens !== undefined ? { max_tokens: body.max_output_tokens } : {}),
  });
  const messages = messagesOf(body.input);
  if (typeof instructions === "string" && instructions !== "")
    messages.unshift({ role: "system", content: instructions });
  return {
    messages,
    instructions,
    previous,
    previousId,
    store,
    stream: flag("stream", false),
    background,
    clientTools,
    tools,
    sampling,
  };
}
