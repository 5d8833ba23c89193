// OpenAI's Responses API on the gateway's HTTP address, as its API reference defines it
// (https://platform.openai.com/docs/api-reference/responses):
//   POST /v1/responses                 a run, answered whole, streamed, or in the background;
//   GET  /v1/responses/{id}            the response as it stands (?stream=true: its events,
//                                      after ?starting_after=N);
//   POST /v1/responses/{id}/cancel     aborts the response's run.
//
// What maps to what:
//   - a response is a run of a session; its id says which (responses-input.ts), and the session's
//     log is where it is stored: GET reads the run back from it, on any gateway;
//   - without previous_response_id, the input items are the conversation (as Chat Completions'
//     messages are, openai-history.ts): a new session is made from those before the last user
//     message. With it, the input continues that response's session and holds only what is new.
//     A session does not branch: continuing from a response that a later one already continued
//     is a 400 (`previous_response_not_latest`);
//   - `instructions` and system or developer items are the run's instruction;
//   - function tools are the run's client tools: a call ends the response (status completed,
//     a function_call item); a request whose input ends in function_call_output items answers the
//     waiting run, and its response is the rest of that run;
//   - `store: false`: the session goes once the run has ended; `background: true`: the answer is
//     the queued response, the run goes on without the request;
//   - temperature and max_output_tokens are the run's; any other parameter that asks for
//     something is a 400 naming it.
import { randomUUID } from "node:crypto";
import type { NetPolicy } from "../../shared/net/net-guard.js";
import { Status, grpcCode } from "../../shared/errors.js";
import { CONVERSATION_SESSION_PREFIX, RESPONSE_SESSION_PREFIX } from "../../shared/ids.js";
import type { GatewayClient } from "./edge.js";
import { openEventStream, writeEvent, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import { forwardedMetadata } from "./metadata.js";
import { requestConversation } from "./openai-history.js";
import { agentOf, ApiError, apiErrorOf, MODEL_PREFIX, readJson, sendJson } from "./openai-request.js";
import { conversationRuns } from "./openai-session.js";
import { toolResultsOf } from "./openai-tools.js";
import { newResponse, ResponseFold, type StreamEvent } from "./responses-output.js";
import { type ResponseRef, responseIdOf, responseRefOf, responsesRequestOf } from "./responses-input.js";
import { cancelOnceStarted, joinsOf, runEvents, runSnapshot } from "./run-events.js";

/** A run this long without its end is given up on by the request (the run itself goes on). */
const RUN_TIMEOUT_MS = 15 * 60_000;
/** How long a cancel waits for the aborted run to end before answering with what it has. */
const CANCEL_WAIT_MS = 10_000;

type Metadata = ReturnType<typeof forwardedMetadata>;

const notFound = (id: string) =>
  new ApiError(
    404,
    `Response with id '${id.slice(0, 200)}' not found.`,
    "invalid_request_error",
    "not_found",
    "response_id",
  );

export function openAiResponses(gateway: GatewayClient, opts: { maxBodyBytes: number; net: NetPolicy }) {
  const { ask, answerCalls } = conversationRuns(gateway);

  /**
   * The response `id` names, as it stands now, read from its session; with `toPresent`, the
   * session's later events are read too, to say whether another run came after it.
   */
  const current = async (id: string, metadata: Metadata, toPresent = false) => {
    const ref = responseRefOf(id);
    if (!ref) throw notFound(id);
    const run = await runSnapshot(gateway, ref, metadata, toPresent).catch((err) => {
      throw grpcCode(err) === Status.NOT_FOUND ? notFound(id) : err;
    });
    if (!run.accepted) throw notFound(id);
    const fold = new ResponseFold(
      newResponse({
        id,
        model: `${MODEL_PREFIX}${run.agentId}`,
        background: false,
        store: true,
        previous_response_id: null,
        created_at: run.acceptedAt,
      }),
      ref.sessionId,
    );
    for (const e of run.events) fold.take(e);
    fold.settle();
    return { ref, fold, later: run.later };
  };

  const sse = (res: NodeServerResponse, e: StreamEvent) => writeEvent(res, e, e.type);

  /**
   * Follows a response's run to its end (or its wait on the client) through `fold`, streaming
   * its events to `res` when `stream`; `from` skips events up to that sequence number.
   */
  const follow = async (
    ref: ResponseRef,
    fold: ResponseFold,
    metadata: Metadata,
    res: NodeServerResponse,
    stream: boolean,
    from = -1,
  ) => {
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), RUN_TIMEOUT_MS);
    const gone = () => stop.abort();
    res.once("close", gone);
    try {
      if (stream) for (const e of fold.opening()) if (e.sequence_number > from) await sse(res, e);
      for await (const event of runEvents(gateway, {
        sessionId: ref.sessionId,
        afterSeq: ref.afterSeq,
        frameId: ref.frameId,
        joins: joinsOf(ref),
        metadata,
        signal: stop.signal,
      })) {
        for (const e of fold.take(event)) if (stream && e.sequence_number > from) await sse(res, e);
        if (fold.done) break;
      }
    } catch (err) {
      if (res.destroyed) return;
      throw stop.signal.aborted ? new ApiError(504, "the run did not end in time", "server_error") : err;
    } finally {
      clearTimeout(timer);
      res.off("close", gone);
    }
  };

  const create = async (req: NodeServerRequest, res: NodeServerResponse) => {
    const body = await readJson(req, opts.maxBodyBytes);
    const agentId = agentOf(body.model);
    const r = responsesRequestOf(body);
    const metadata = forwardedMetadata(req.headers);
    const results = toolResultsOf(r.messages);
    let ref: ResponseRef;
    let createdAt: number;
    if (results.length > 0) {
      // The input ends in function results: they answer the run that waits on them.
      if (r.previous) await current(r.previousId!, metadata);
      const answered = await answerCalls(results, r.previous?.sessionId ?? "", metadata);
      const first = [...answered.frames][0];
      ref = { sessionId: answered.sessionId, afterSeq: answered.afterSeq, kind: "c", frameId: first };
      createdAt = answered.acceptedAt;
    } else {
      const conversation = await requestConversation(r.messages, opts.net);
      let named = "";
      if (r.previous) {
        const prev = await current(r.previousId!, metadata, true);
        if (conversation.earlier.length > 0)
          throw new ApiError(
            400,
            "with previous_response_id, `input` holds only what is new: one user message (and system or developer messages), or function_call_output items",
            undefined,
            null,
            "input",
          );
        if (!prev.fold.done)
          throw new ApiError(
            400,
            `Previous response '${r.previousId!.slice(0, 200)}' has not finished`,
            undefined,
            "previous_response_in_progress",
            "previous_response_id",
          );
        if (prev.later)
          throw new ApiError(
            400,
            "a later response already continues this one: a Troupe conversation does not branch; continue from its latest response",
            undefined,
            "previous_response_not_latest",
            "previous_response_id",
          );
        named = r.previous.sessionId;
      }
      const frameId = randomUUID().replaceAll("-", "");
      const prefix = r.store ? RESPONSE_SESSION_PREFIX : CONVERSATION_SESSION_PREFIX;
      const asked = await ask(
        named,
        prefix,
        agentId,
        { ...conversation, sampling: r.sampling },
        r.clientTools,
        frameId,
        metadata,
      );
      ref = { sessionId: asked.session, afterSeq: asked.afterSeq - 1n, kind: "p", frameId };
      createdAt = asked.acceptedAt;
    }
    const fold = new ResponseFold(
      newResponse({
        id: responseIdOf(ref),
        created_at: createdAt,
        model: `${MODEL_PREFIX}${agentId}`,
        background: r.background,
        store: r.store,
        previous_response_id: r.previousId,
        instructions: r.instructions,
        max_output_tokens: r.sampling.maxOutputTokens ?? null,
        temperature: r.sampling.temperature ?? null,
        tool_choice: body.tool_choice === "none" ? "none" : "auto",
        tools: r.tools,
        user: typeof body.user === "string" ? body.user : null,
      }),
      ref.sessionId,
    );
    const headers = { "x-troupe-session": ref.sessionId };
    if (r.background) {
      fold.response.status = "queued";
      return sendJson(res, 200, fold.response, headers);
    }
    if (r.stream) openEventStream(res, headers);
    try {
      await follow(ref, fold, metadata, res, r.stream);
    } catch (err) {
      if (!r.stream) throw err;
      const e = apiErrorOf(err);
      await sse(res, { type: "error", sequence_number: 1_000_000, code: e.code, message: e.message, param: e.param });
      return res.end();
    }
    // Not stored: the session goes once nothing more can come of it (a run waiting on the
    // client's results stays for the request that brings them).
    if (!r.store && fold.response.usage !== null)
      await gateway.deleteSession({ sessionId: ref.sessionId }, { metadata }).catch(() => undefined);
    if (r.stream) return res.end();
    if (res.destroyed) return;
    sendJson(res, 200, fold.response, headers);
  };

  const get = async (id: string, url: URL, req: NodeServerRequest, res: NodeServerResponse) => {
    const metadata = forwardedMetadata(req.headers);
    const { ref, fold } = await current(id, metadata);
    if (url.searchParams.get("stream") !== "true") return sendJson(res, 200, fold.response);
    const after = url.searchParams.get("starting_after");
    const from = after === null ? -1 : Number(after);
    if (!Number.isInteger(from) || from < -1)
      throw new ApiError(400, "`starting_after` must be a sequence number", undefined, null, "starting_after");
    // A stream replays the run from its start through a fold of its own, so that its sequence
    // numbers are the ones a stream of the same response always has.
    const replay = new ResponseFold(
      newResponse({ ...fold.response, status: "in_progress", output: [], usage: null }),
      ref.sessionId,
    );
    openEventStream(res);
    try {
      await follow(ref, replay, metadata, res, true, from);
    } catch (err) {
      const e = apiErrorOf(err);
      await sse(res, { type: "error", sequence_number: 1_000_000, code: e.code, message: e.message, param: e.param });
    }
    res.end();
  };

  const cancel = async (id: string, req: NodeServerRequest, res: NodeServerResponse) => {
    const metadata = forwardedMetadata(req.headers);
    // The answer is the response as the abort left it (or as it stands after CANCEL_WAIT_MS).
    const { last } = await cancelOnceStarted(
      () => current(id, metadata),
      {
        started: (now) => now.fold.response.status === "in_progress",
        done: (now) => now.fold.done,
        abort: (now) =>
          gateway.abort(
            { sessionId: now.ref.sessionId, frameId: randomUUID(), reason: "the response was cancelled" },
            { metadata },
          ),
      },
      CANCEL_WAIT_MS,
    );
    sendJson(res, 200, last.fold.response);
  };

  /** Answers the request when it is one of the Responses API's; false when it is not. */
  return async (req: NodeServerRequest, res: NodeServerResponse, url: URL): Promise<boolean> => {
    const m = /^\/v1\/responses(?:\/([^/]+)(\/cancel)?)?$/.exec(url.pathname);
    if (!m) return false;
    const [, segment, cancelling] = m;
    let id: string;
    try {
      id = segment === undefined ? "" : decodeURIComponent(segment);
    } catch {
      throw notFound(segment ?? "");
    }
    if (segment === undefined) {
      if (req.method !== "POST") throw new ApiError(405, "use POST");
      await create(req, res);
    } else if (cancelling) {
      if (req.method !== "POST") throw new ApiError(405, "use POST");
      await cancel(id, req, res);
    } else {
      if (req.method !== "GET") throw new ApiError(405, "use GET");
      await get(id, url, req, res);
    }
    return true;
  };
}
