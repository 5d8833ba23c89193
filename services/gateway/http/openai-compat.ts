// An OpenAI-compatible endpoint on the gateway's HTTP address, so the official `openai` clients,
// and the tools built on them, talk to a Troupe agent with `base_url` pointed here:
//   POST /v1/chat/completions (streamed as server-sent events, or not), GET /v1/models[/{id}],
//   and the Responses API's calls (openai-responses.ts).
// Shapes follow OpenAI's API reference: https://platform.openai.com/docs/api-reference/chat
// (the chat completion object, the chunk object, usage) and .../api-reference/models; errors are
// its `{"error": {message, type, param, code}}` with the HTTP statuses its clients map to classes.
//
// What maps to what:
//   - `model` picks the agent: `troupe/<agent>` (or `troupe`, the default agent);
//   - the conversation (openai-history.ts): with no session named, the request's messages are
//     the conversation, as Chat Completions is meant: a session is made from the messages before
//     the last user message, the last one is the prompt (`x-troupe-history: client`); that
//     session, unnamed, stays for a retry or the client's tool results, and goes after an idle
//     hour (retention.ts). The `x-troupe-session` header naming one of the
//     caller's sessions, or `user` naming a stable one (one per caller, agent and user), makes the
//     session hold the history (`x-troupe-history: session`): the request's earlier messages are
//     checked against it (400 when they differ; a new session takes them as its history). The
//     session id comes back in `x-troupe-session`. System and developer messages are the run's
//     instruction, below the agent's own prompt; the last message's image_url parts (data URLs,
//     or http(s) fetched through the SSRF guard) go to vision models as channel images do;
//   - `temperature` and `max_tokens` are the run's (Prompt.sampling); any other parameter that
//     asks for something is a 400 naming it (openai-request.ts samplingOf);
//   - the agent's own tools run server-side; with `x-troupe-tool-progress: 1`, their calls and
//     results are streamed as content lines; the request's function `tools` are the run's client
//     tools: a call to one ends the response with `tool_calls`, and the next request, ending in
//     the `tool` messages, answers the waiting run and gets the rest of it (openai-tools.ts);
//   - usage is the run's, summed over its model calls;
//   - a runner that dies mid-run is waited for: the run goes on after its restart (run-events.ts).
// Every step is a gateway gRPC call with the caller's key (gateway/http/edge.ts), so keys, limits and
// quotas are the gRPC API's.
import { createHash, randomUUID } from "node:crypto";
import type { NetPolicy } from "../../shared/net/net-guard.js";
import { requestConversation } from "./openai-history.js";
import { conversationRuns } from "./openai-session.js";
import { openAiResponses } from "./openai-responses.js";
import { Role, StopReason, type AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { callIdFor, clientToolsOf, toolResultsOf } from "./openai-tools.js";
import { listAgents } from "./agent-list.js";
import { CONVERSATION_SESSION_PREFIX } from "../../shared/ids.js";
import type { GatewayClient } from "./edge.js";
import { openEventStream, writeEvent, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import { forwardedMetadata } from "./metadata.js";
import { runEvents } from "./run-events.js";
import { StreamedText } from "../../shared/streamed-text.js";
import {
  agentOf,
  ApiError,
  apiErrorOf,
  MODEL_PREFIX,
  readJson,
  samplingOf,
  sendError,
  sendJson,
} from "./openai-request.js";

/** A run this long without its end is given up on (the run itself goes on). */
const RUN_TIMEOUT_MS = 15 * 60_000;
const TOOL_PROGRESS_CHARS = 500;
/** A streamed call's arguments go out in pieces of this many characters, as deltas. */
const ARGUMENT_PIECE = 256;

/** A path segment's escapes decoded; a segment whose escapes do not decode names no model. */
function decodedOr404(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new ApiError(404, `The model \`${segment.slice(0, 100)}\` does not exist`, undefined, "model_not_found");
  }
}

/** A request without a session is answered in one made from its messages (retention.ts removes it). */
const EPHEMERAL = CONVERSATION_SESSION_PREFIX;

export function openAiCompat(
  gateway: GatewayClient,
  opts: { maxBodyBytes: number; agentsDir: string; net: NetPolicy },
) {
  const listModels = async () =>
    (await listAgents(opts.agentsDir)).map((a) => ({
      id: `${MODEL_PREFIX}${a}`,
      object: "model",
      created: 0,
      owned_by: "troupe",
    }));

  /** What the request asks for. Its key was checked before its body was read (admission.ts). */
  const chatRequest = async (req: NodeServerRequest) => {
    const body = await readJson(req, opts.maxBodyBytes);
    const agentId = agentOf(body.model);
    const clientTools = clientToolsOf(body);
    // A request that ends in `tool` messages answers a run waiting on them; any other asks anew.
    const results = toolResultsOf(body.messages);
    const conversation = results.length > 0 ? undefined : await requestConversation(body.messages, opts.net);
    const sampling = samplingOf(body);
    if (body.user !== undefined && (typeof body.user !== "string" || body.user.length > 256))
      throw new ApiError(400, "`user` must be a string of at most 256 characters", undefined, null, "user");
    return { body, agentId, conversation, clientTools, results, sampling };
  };

  const { ask, answerCalls } = conversationRuns(gateway);

  const chat = async (req: NodeServerRequest, res: NodeServerResponse) => {
    const { body, agentId, conversation, clientTools, results, sampling } = await chatRequest(req);
    const stream = body.stream === true;
    const includeUsage = (body.stream_options as { include_usage?: unknown } | undefined)?.include_usage === true;
    const toolProgress = req.headers["x-troupe-tool-progress"] === "1";
    const metadata = forwardedMetadata(req.headers);

    // The session: named, or one per (caller, agent, user), or a new one. CreateSession opens an
    // existing session of the caller's, so a stable id needs no lookup first.
    const named = req.headers["x-troupe-session"];
    const sessionId =
      typeof named === "string" && named !== ""
        ? named
        : typeof body.user === "string" && body.user !== ""
          ? `openai-${createHash("sha256").update(`${agentId}\0${body.user}`).digest("hex").slice(0, 40)}`
          : "";
    const frameId = randomUUID();
    let session: string;
    let following: { afterSeq: bigint; joins?: (e: AgentEvent) => boolean };
    if (results.length > 0) {
      const answered = await answerCalls(results, typeof named === "string" ? named : "", metadata);
      session = answered.sessionId;
      following = answered;
    } else {
      const asked = await ask(
        sessionId,
        EPHEMERAL,
        agentId,
        { ...conversation!, sampling },
        clientTools,
        frameId,
        metadata,
      );
      session = asked.session;
      following = { afterSeq: asked.afterSeq };
    }
    // Which held the conversation: the request's messages, or the session.
    const sessionHeaders = {
      "x-troupe-history": session.startsWith(EPHEMERAL) ? "client" : "session",
      "x-troupe-session": session,
    };

    const id = `chatcmpl-${frameId}`;
    const created = Math.floor(Date.now() / 1000);
    const model = `${MODEL_PREFIX}${agentId}`;
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), RUN_TIMEOUT_MS);
    let finished = false;
    let runningTurn = false;
    res.once("close", () => {
      if (finished) return;
      // The client went away mid-run: the run stops too, as OpenAI's does.
      if (runningTurn)
        void gateway
          .abort({ sessionId: session, frameId: randomUUID(), reason: "the HTTP client went away" }, { metadata })
          .catch(() => undefined);
      stop.abort();
    });
    const chunk = (delta: Record<string, unknown>, finishReason: string | null = null) => ({
      id,
      object: "chat.completion.chunk",
      created,
      model,
      system_fingerprint: null,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    });
    const write = (data: unknown) => writeEvent(res, data);

    let text = "";
    /** The client's calls the run waits on, as the response hands them out. */
    const toolCalls: { id: string; type: "function"; function: { name: string; arguments: string } }[] = [];
    let usage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
    let finishReason = "stop";
    let assistantMessages = 0;
    /** What of each assistant message has been passed on, so that a replay's gap leaves no hole. */
    const passed = new StreamedText();
    const content = async (piece: string) => {
      text += piece;
      if (stream && piece !== "") await write(chunk({ content: piece }));
    };
    if (stream) {
      openEventStream(res, sessionHeaders);
      await write(chunk({ role: "assistant", content: "" }));
    }
    try {
      for await (const event of runEvents(gateway, {
        sessionId: session,
        afterSeq: following.afterSeq,
        frameId,
        metadata,
        signal: stop.signal,
        joins: following.joins,
      })) {
        runningTurn = true;
        const p = event.payload;
        if (p.case === "messageStart" && p.value.message?.role === Role.ASSISTANT) {
          if (assistantMessages++ > 0 && text !== "") await content("\n\n");
          passed.start(p.value.message.id, event.seq);
        } else if (p.case === "gap") passed.gap(event.seq);
        else if (p.case === "messageUpdate" && p.value.delta.case === "text")
          await content(passed.delta(p.value.messageId, p.value.delta.value));
        else if (p.case === "messageEnd" && p.value.message?.role === Role.ASSISTANT)
          await content(passed.end(p.value.message.id, p.value.message.text));
        else if (p.case === "runResumed") {
          // The message a runner's death cut off is asked for again: a reply not yet sent keeps
          // only the new one; a stream cannot take back what it sent, so the new one follows it.
          const cut = passed.resumed().join("");
          if (!stream) text = text.slice(0, text.length - cut.length);
        } else if (toolProgress && p.case === "toolExecutionStart")
          await content(`\n[${p.value.toolName} ${p.value.argumentsJson.slice(0, TOOL_PROGRESS_CHARS)}]\n`);
        else if (toolProgress && p.case === "toolExecutionEnd") {
          const out = p.value.result.slice(0, TOOL_PROGRESS_CHARS);
          await content(
            `[${p.value.isError ? "failed" : "done"}: ${out}${p.value.result.length > TOOL_PROGRESS_CHARS ? "..." : ""}]\n`,
          );
        } else if (p.case === "clientToolCall") {
          const call = {
            id: callIdFor(session, p.value.toolCallId),
            type: "function" as const,
            function: { name: p.value.toolName, arguments: p.value.argumentsJson },
          };
          const index = toolCalls.push(call) - 1;
          if (stream) {
            // As the reference streams a call: its id and name first, then its arguments in pieces.
            await write(
              chunk({ tool_calls: [{ index, ...call, function: { name: call.function.name, arguments: "" } }] }),
            );
            for (let at = 0; at < call.function.arguments.length; at += ARGUMENT_PIECE)
              await write(
                chunk({
                  tool_calls: [
                    { index, function: { arguments: call.function.arguments.slice(at, at + ARGUMENT_PIECE) } },
                  ],
                }),
              );
          }
        } else if (p.case === "runWaiting" && toolCalls.length > 0) {
          // The run waits for the client: this response ends here, the next request goes on.
          finishReason = "tool_calls";
          break;
        } else if (p.case === "agentEnd") {
          const u = p.value.usage;
          usage = {
            prompt_tokens: u?.inputTokens ?? 0,
            completion_tokens: u?.outputTokens ?? 0,
            total_tokens: (u?.inputTokens ?? 0) + (u?.outputTokens ?? 0),
          };
          if (p.value.stopReason === StopReason.LENGTH) finishReason = "length";
          else if (p.value.stopReason === StopReason.ERROR)
            throw new ApiError(502, p.value.errorMessage || "the agent's run failed", "server_error", "run_failed");
        }
      }
    } catch (err) {
      if (res.destroyed) return; // the client went away
      const e = stop.signal.aborted
        ? new ApiError(504, "the run did not end in time", "server_error")
        : apiErrorOf(err);
      if (!stream) throw e;
      await write({ error: { message: e.message, type: e.type, param: e.param, code: e.code } });
      res.end("data: [DONE]\n\n");
      return;
    } finally {
      finished = true;
      clearTimeout(timer);
    }
    if (!stream) {
      return sendJson(
        res,
        200,
        {
          id,
          object: "chat.completion",
          created,
          model,
          system_fingerprint: null,
          choices: [
            {
              index: 0,
              message: {
                role: "assistant",
                content: toolCalls.length > 0 && text === "" ? null : text,
                refusal: null,
                ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
              },
              logprobs: null,
              finish_reason: finishReason,
            },
          ],
          usage,
        },
        sessionHeaders,
      );
    }
    await write(chunk({}, finishReason));
    if (includeUsage)
      await write({
        id,
        object: "chat.completion.chunk",
        created,
        model,
        system_fingerprint: null,
        choices: [],
        usage,
      });
    res.end("data: [DONE]\n\n");
  };

  const responses = openAiResponses(gateway, opts);

  return async (req: NodeServerRequest, res: NodeServerResponse): Promise<boolean> => {
    const url = new URL(req.url ?? "/", "http://troupe");
    if (!url.pathname.startsWith("/v1/")) return false;
    try {
      if (await responses(req, res, url)) return true;
      if (url.pathname === "/v1/chat/completions") {
        if (req.method !== "POST") throw new ApiError(405, "use POST");
        await chat(req, res);
      } else if (url.pathname === "/v1/models" || url.pathname.startsWith("/v1/models/")) {
        if (req.method !== "GET") throw new ApiError(405, "use GET");
        const models = await listModels();
        const one = decodedOr404(url.pathname.slice("/v1/models/".length));
        if (url.pathname === "/v1/models") sendJson(res, 200, { object: "list", data: models });
        else {
          const found = models.find((m) => m.id === one);
          if (!found)
            throw new ApiError(404, `The model \`${one.slice(0, 100)}\` does not exist`, undefined, "model_not_found");
          sendJson(res, 200, found);
        }
      } else throw new ApiError(404, `no route ${req.method} ${url.pathname.slice(0, 100)}`, undefined, "unknown_url");
    } catch (err) {
      if (res.headersSent) res.destroy();
      else sendError(res, apiErrorOf(err));
    }
    return true;
  };
}
