// The sessions behind the OpenAI-compatible faces (openai-compat.ts, openai-responses.ts): a
// request's prompt put in the session it continues, checked against what that session holds, and
// a request's function results given to the run that waits on them.
import { createHash, randomUUID } from "node:crypto";
import type { Conversation } from "./openai-history.js";
import { sameConversation } from "./openai-history.js";
import { QueueMode, type AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { callOf, type clientToolsOf } from "./openai-tools.js";
import type { GatewayClient } from "./edge.js";
import type { forwardedMetadata } from "./metadata.js";
import { ApiError, type samplingOf } from "./openai-request.js";
import { secondsOf } from "./run-events.js";

/** Pages of a session's history read to check a request's earlier messages against it. */
const HISTORY_PAGES = 20;

export function conversationRuns(gateway: GatewayClient) {
  /** Every message of a session, oldest first (up to HISTORY_PAGES pages). */
  const sessionHistory = async (sessionId: string, metadata: ReturnType<typeof forwardedMetadata>) => {
    const out = [];
    let pageToken = "";
    for (let i = 0; i < HISTORY_PAGES; i++) {
      const page = await gateway.getHistory({ sessionId, pageSize: 1000, pageToken }, { metadata });
      out.push(...page.messages);
      pageToken = page.nextPageToken;
      if (pageToken === "") break;
    }
    return out;
  };

  /**
   * Opens the session a request continues and puts its prompt in: a named one, whose history the
   * request's earlier messages must match (or become, when it has none); or one made from them.
   */
  const ask = async (
    named: string,
    /** A new session's id starts so (the retention of sessions made so goes by it). */
    prefix: string,
    agentId: string,
    c: Conversation & { sampling: ReturnType<typeof samplingOf> },
    clientTools: ReturnType<typeof clientToolsOf>,
    frameId: string,
    metadata: ReturnType<typeof forwardedMetadata>,
  ) => {
    let session: string;
    if (named === "") {
      const opened = await gateway.createSession(
        { sessionId: `${prefix}${randomUUID()}`, agentId, history: c.earlier },
        { metadata },
      );
      session = opened.session!.sessionId;
    } else {
      session = (await gateway.createSession({ sessionId: named, agentId }, { metadata })).session!.sessionId;
      const held = await sessionHistory(session, metadata);
      if (held.length === 0 && c.earlier.length > 0)
        await gateway.createSession({ sessionId: session, agentId, history: c.earlier }, { metadata });
      else {
        const differs = sameConversation(c.earlier, held);
        if (differs)
          throw new ApiError(
            400,
            `the messages do not continue session ${session}: ${differs}. Send only the new message, or the session's own history, or name no session (no x-troupe-session header, no user) to have the messages be the conversation`,
            undefined,
            "conversation_mismatch",
            "messages",
          );
      }
    }
    const sent = await gateway.sendMessage(
      {
        sessionId: session,
        frameId,
        text: c.prompt.text,
        queueMode: QueueMode.FOLLOWUP,
        clientTools,
        instruction: c.instruction,
        images: c.prompt.images,
        sampling: c.sampling,
      },
      { metadata },
    );
    const accepted = sent.accepted!;
    // A frame sent before (a client's retry) is not run again: its run is the one it started.
    const duplicate = accepted.payload.case === "frameAccepted" && accepted.payload.value.duplicate;
    return { session, afterSeq: accepted.seq, duplicate, acceptedAt: secondsOf(accepted) };
  };

  /**
   * Answers the waiting run's client calls with the request's `tool` messages; returns the session,
   * where to follow its events from, and how to know the run's first event. A resent request's
   * answers are duplicates (their frame ids come from the call and the output), so the run is
   * followed from the session's start.
   */
  const answerCalls = async (
    results: { toolCallId: string; output: string }[],
    named: string,
    metadata: ReturnType<typeof forwardedMetadata>,
  ) => {
    const calls = results.map((r) => ({ ...r, ...callOf(r.toolCallId) }));
    const sessionId = calls[0].sessionId;
    if (calls.some((c) => c.sessionId !== sessionId) || (named !== "" && named !== sessionId))
      throw new ApiError(400, "the tool messages answer calls of more than one session", undefined, null, "messages");
    const frames = new Set<string>();
    const accepted: AgentEvent[] = [];
    for (const c of calls) {
      const frameId = `oa-tool-${createHash("sha256").update(`${c.toolCallId}\0${c.output}`).digest("hex").slice(0, 40)}`;
      frames.add(frameId);
      const ack = await gateway.submitToolResult(
        { sessionId, frameId, toolCallId: c.id, output: c.output, isError: false },
        { metadata },
      );
      accepted.push(ack.accepted!);
    }
    const duplicate = accepted.some((a) => a.payload.case === "frameAccepted" && a.payload.value.duplicate);
    // Followed from just before the first answer the session took (answers are sent one after
    // another, so the first has the lowest seq), or from the session's start for a resend.
    const afterSeq = duplicate ? 0n : accepted[0].seq - 1n;
    const joins = (e: AgentEvent) => e.payload.case === "clientToolAnswered" && frames.has(e.payload.value.frameId);
    return { sessionId, afterSeq, joins, frames, acceptedAt: secondsOf(accepted[0]) };
  };

  return { ask, answerCalls };
}
