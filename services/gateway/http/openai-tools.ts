// OpenAI function calling on /v1/chat/completions, as the API reference defines it
// (https://platform.openai.com/docs/api-reference/chat/create: `tools`, `tool_choice`, the
// assistant message's `tool_calls`, `role: "tool"` messages): a request's function tools are the
// run's client tools (ClientTool); a call to one ends the response with finish_reason
// "tool_calls"; the client's next request, ending in its `tool` messages, answers the waiting run.
//
// The ids handed out say which session waits: `tc.<session id, base64url>.<the call's id>`. A
// request that names no session finds it this way; the session is looked up under the caller's
// key like any other, so an id names nothing of anyone else's.
import { ApiError } from "./openai-request.js";

const NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** The request's function tools as client tools; none when tool_choice is "none". */
export function clientToolsOf(
  body: Record<string, unknown>,
): { name: string; description: string; parametersJson: string }[] {
  const { tools, tool_choice: choice } = body;
  if (tools === undefined || tools === null) {
    if (choice !== undefined && choice !== "none" && choice !== "auto")
      throw new ApiError(400, "`tool_choice` names a tool but `tools` is empty", undefined, null, "tool_choice");
    return [];
  }
  if (!Array.isArray(tools) || tools.length > 64)
    throw new ApiError(400, "`tools` must be an array of at most 64 tools", undefined, null, "tools");
  // The agent's model decides whether to call: a forced call cannot be honoured, so it is refused.
  if (choice !== undefined && choice !== "auto" && choice !== "none")
    throw new ApiError(
      400,
      '`tool_choice` may be "auto" or "none": the agent decides which tools it calls',
      undefined,
      null,
      "tool_choice",
    );
  const out = tools.map((t: unknown, i) => {
    const fn = (t as { type?: unknown; function?: Record<string, unknown> })?.function;
    if ((t as { type?: unknown })?.type !== "function" || typeof fn !== "object" || fn === null)
      throw new ApiError(400, `tools[${i}] must be {"type": "function", "function": {...}}`, undefined, null, "tools");
    if (typeof fn.name !== "string" || !NAME.test(fn.name))
      throw new ApiError(400, `tools[${i}].function.name must be 1-64 of a-z A-Z 0-9 _ -`, undefined, null, "tools");
    if (fn.description !== undefined && typeof fn.description !== "string")
      throw new ApiError(400, `tools[${i}].function.description must be a string`, undefined, null, "tools");
    const parameters = fn.parameters ?? { type: "object", properties: {} };
    if (typeof parameters !== "object" || parameters === null || Array.isArray(parameters))
      throw new ApiError(400, `tools[${i}].function.parameters must be a JSON Schema object`, undefined, null, "tools");
    return {
      name: fn.name,
      description: (fn.description as string | undefined) ?? "",
      parametersJson: JSON.stringify(parameters),
    };
  });
  return choice === "none" ? [] : out;
}

/** The id a client gets for call `id` of session `sessionId`. */
export const callIdFor = (sessionId: string, id: string): string =>
  `tc.${Buffer.from(sessionId).toString("base64url")}.${id}`;

/** The session and the call an id handed out names. */
export function callOf(handedOut: string): { sessionId: string; id: string } {
  const m = /^tc\.([A-Za-z0-9_-]+)\.(.+)$/s.exec(handedOut);
  if (!m)
    throw new ApiError(
      400,
      `tool_call_id ${JSON.stringify(handedOut.slice(0, 100))} is not one this server gave out`,
      undefined,
      null,
      "messages",
    );
  return { sessionId: Buffer.from(m[1], "base64url").toString("utf8"), id: m[2] };
}

/** The results the request carries: the `tool` messages at its end (a request that ends in them answers a waiting run). */
export function toolResultsOf(messages: unknown): { toolCallId: string; output: string }[] {
  if (!Array.isArray(messages)) return [];
  const out: { toolCallId: string; output: string }[] = [];
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as { role?: unknown; tool_call_id?: unknown; content?: unknown };
    if (m?.role !== "tool") break;
    if (typeof m.tool_call_id !== "string")
      throw new ApiError(400, `messages[${i}].tool_call_id must be a string`, undefined, null, "messages");
    const content = m.content;
    const output =
      typeof content === "string"
        ? content
        : Array.isArray(content)
          ? content.map((p: { text?: unknown }) => (typeof p?.text === "string" ? p.text : "")).join("")
          : "";
    out.unshift({ toolCallId: m.tool_call_id, output });
  }
  return out;
}
