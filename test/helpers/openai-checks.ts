// The request checks of OpenAI's Chat Completions API that do not depend on the model: which
// top-level parameters exist, what a message and a tool look like, and how tool results pair with
// the assistant message that asked for them. Source: https://platform.openai.com/docs/api-reference/chat/create
// (request body); the error wording follows what the API answers for each.

export interface ApiError {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

const error = (message: string, param: string | null, code: string | null = null): ApiError => ({
  message,
  type: "invalid_request_error",
  param,
  code,
});

/** The request body's parameters, as the reference lists them; anything else is refused. */
export const KNOWN_PARAMETERS = new Set([
  "model",
  "messages",
  "audio",
  "frequency_penalty",
  "function_call",
  "functions",
  "logit_bias",
  "logprobs",
  "max_completion_tokens",
  "max_tokens",
  "metadata",
  "modalities",
  "n",
  "parallel_tool_calls",
  "prediction",
  "presence_penalty",
  "prompt_cache_key",
  "reasoning_effort",
  "response_format",
  "safety_identifier",
  "seed",
  "service_tier",
  "stop",
  "store",
  "stream",
  "stream_options",
  "temperature",
  "tool_choice",
  "tools",
  "top_logprobs",
  "top_p",
  "user",
  "verbosity",
  "web_search_options",
]);

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

/**
 * Messages: a non-empty list; each with a known role and string (or parts) content; an assistant
 * message with tool_calls followed by one tool message per call id, and every tool message answering
 * such a call.
 */
export function checkMessages(messages: unknown): ApiError | undefined {
  if (!Array.isArray(messages) || messages.length === 0)
    return error(
      "Invalid 'messages': empty array. Expected an array with minimum length 1.",
      "messages",
      "empty_array",
    );
  let pending: Set<string> | undefined;
  let pendingAt = -1;
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i] as Record<string, unknown>;
    const at = `messages.[${i}]`;
    if (typeof m !== "object" || m === null || !ROLES.has(m.role as string))
      return error(
        `Invalid value: '${(m as { role?: unknown })?.role}'. Supported values are: 'system', 'assistant', 'user', 'tool', 'developer'.`,
        `${at}.role`,
        "invalid_value",
      );
    if (m.role === "tool") {
      if (typeof m.tool_call_id !== "string")
        return error(
          `Missing required parameter: '${at}.tool_call_id'.`,
          `${at}.tool_call_id`,
          "missing_required_parameter",
        );
      if (!pending?.has(m.tool_call_id))
        return error(
          "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
          `${at}.role`,
        );
      pending.delete(m.tool_call_id);
      if (typeof m.content !== "string" && !Array.isArray(m.content))
        return error(
          `Invalid type for '${at}.content': expected one of a string or array of objects.`,
          `${at}.content`,
          "invalid_type",
        );
      continue;
    }
    if (pending && pending.size > 0)
      return error(
        `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: ${[...pending].join(", ")}`,
        `messages.[${pendingAt}].role`,
      );
    pending = undefined;
    const calls = m.tool_calls as {
      id?: unknown;
      type?: unknown;
      function?: { name?: unknown; arguments?: unknown };
    }[];
    if (m.role === "assistant" && calls !== undefined) {
      if (!Array.isArray(calls) || calls.length === 0)
        return error(
          `Invalid 'messages[${i}].tool_calls': empty array. Expected an array with minimum length 1.`,
          `messages[${i}].tool_calls`,
          "empty_array",
        );
      for (const c of calls)
        if (
          typeof c.id !== "string" ||
          c.type !== "function" ||
          typeof c.function?.name !== "string" ||
          typeof c.function.arguments !== "string"
        )
          return error(
            `Invalid 'messages[${i}].tool_calls': each needs id, type 'function', function.name and function.arguments (a string).`,
            `messages[${i}].tool_calls`,
            "invalid_value",
          );
      pending = new Set(calls.map((c) => c.id as string));
      pendingAt = i;
      if (m.content !== null && m.content !== undefined && typeof m.content !== "string")
        return error(`Invalid type for '${at}.content'.`, `${at}.content`, "invalid_type");
      continue;
    }
    if (typeof m.content !== "string" && !Array.isArray(m.content))
      return error(
        `Invalid type for '${at}.content': expected one of a string or array of objects.`,
        `${at}.content`,
        "invalid_type",
      );
    if (Array.isArray(m.content)) {
      const parts = checkParts(m.content, i, m.role as string);
      if (parts) return parts;
    }
  }
  if (pending && pending.size > 0)
    return error(
      `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: ${[...pending].join(", ")}`,
      `messages.[${pendingAt}].role`,
    );
  return undefined;
}

const PART_TYPES = ["text", "image_url", "input_audio", "refusal", "audio", "file"];

/**
 * Content parts (the reference's "Array of content parts"): text {text}, image_url {image_url:
 * {url, detail}}, input_audio, file; images only in user messages.
 */
function checkParts(parts: unknown[], i: number, role: string): ApiError | undefined {
  for (const [j, raw] of parts.entries()) {
    const p = raw as Record<string, unknown>;
    const at = `messages[${i}].content[${j}]`;
    if (typeof p !== "object" || p === null || !PART_TYPES.includes(p.type as string))
      return error(
        `Invalid value: '${(p as { type?: unknown })?.type}'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal', 'audio', and 'file'.`,
        `${at}.type`,
        "invalid_value",
      );
    if (p.type === "text" && typeof p.text !== "string")
      return error(`Missing required parameter: '${at}.text'.`, `${at}.text`, "missing_required_parameter");
    if (p.type === "image_url") {
      if (role !== "user")
        return error(
          `Invalid 'messages[${i}]'. Image URLs are only allowed for messages with role 'user', but this message with role '${role}' contains an image URL.`,
          `messages[${i}]`,
          "invalid_value",
        );
      const image = p.image_url as { url?: unknown; detail?: unknown } | undefined;
      if (typeof image?.url !== "string")
        return error(
          `Missing required parameter: '${at}.image_url.url'.`,
          `${at}.image_url.url`,
          "missing_required_parameter",
        );
      if (image.detail !== undefined && !["auto", "low", "high"].includes(image.detail as string))
        return error(
          `Invalid value: '${image.detail}'. Supported values are: 'auto', 'low', and 'high'.`,
          `${at}.image_url.detail`,
          "invalid_value",
        );
    }
  }
  return undefined;
}

/** Tools: at most 128 functions, each named by ^[a-zA-Z0-9_-]{1,64}$ with an object schema. */
export function checkTools(tools: unknown): ApiError | undefined {
  if (tools === undefined) return undefined;
  if (!Array.isArray(tools)) return error("Invalid type for 'tools': expected an array.", "tools", "invalid_type");
  if (tools.length > 128)
    return error(
      `Invalid 'tools': array too long. Expected an array with maximum length 128, but got an array with length ${tools.length} instead.`,
      "tools",
      "array_above_max_length",
    );
  for (let i = 0; i < tools.length; i++) {
    const t = tools[i] as { type?: unknown; function?: { name?: unknown; parameters?: unknown } };
    if (t?.type !== "function")
      return error(`Invalid value for 'tools[${i}].type'.`, `tools[${i}].type`, "invalid_value");
    const name = t.function?.name;
    if (typeof name !== "string" || !/^[a-zA-Z0-9_-]{1,64}$/.test(name))
      return error(
        `Invalid 'tools[${i}].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.`,
        `tools[${i}].function.name`,
        "invalid_value",
      );
    const params = t.function?.parameters as { type?: unknown } | undefined;
    if (params !== undefined && (typeof params !== "object" || params.type !== "object"))
      return error(
        `Invalid schema for function '${name}': schema must be a JSON Schema of 'type: "object"'.`,
        `tools[${i}].function.parameters`,
        "invalid_function_parameters",
      );
  }
  return undefined;
}
