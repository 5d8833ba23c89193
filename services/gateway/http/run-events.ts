// The events of one run, for the HTTP faces that answer a request with a run (the OpenAI
// endpoint). A subscription that breaks the way a runner's restart breaks it is made again after
// the last seq seen (shared/resume-policy.ts), instead of failing the request.
import type { AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { Status } from "../../shared/errors.js";
import { RESUME_FOR_MS, resumable, resumeDelayMs } from "../../shared/resume-policy.js";
import type { GatewayClient } from "./edge.js";
import type { forwardedMetadata } from "./metadata.js";
import { ApiError, apiErrorOf } from "./openai-request.js";

/**
 * The events of the run `frameId` started (or, with `joins`, of the run the first event `joins`
 * accepts belongs to: one that goes on after a wait), from after `afterSeq` until its agent_end.
 */
export async function* runEvents(
  gateway: GatewayClient,
  opts: {
    sessionId: string;
    afterSeq: bigint;
    frameId: string;
    metadata: ReturnType<typeof forwardedMetadata>;
    signal: AbortSignal;
    resumeForMs?: number;
    joins?: (event: AgentEvent) => boolean;
  },
): AsyncGenerator<AgentEvent> {
  let afterSeq = opts.afterSeq;
  let turnId = "";
  let lostSince: number | undefined;
  for (;;) {
    const stream = gateway.subscribe(
      { sessionId: opts.sessionId, afterSeq },
      { metadata: opts.metadata, signal: opts.signal },
    );
    try {
      for await (const { event } of stream) {
        if (!event) continue;
        lostSince = undefined;
        if (event.seq > afterSeq) afterSeq = event.seq;
        const p = event.payload;
        if (!turnId) {
          if (opts.joins ? opts.joins(event) : p.case === "agentStart" && p.value.frameId === opts.frameId)
            turnId = event.turnId;
          else if (p.case === "messageBlocked" && p.value.frameId === opts.frameId)
            throw new ApiError(
              400,
              `the message was blocked (${p.value.check}): ${p.value.reason}`,
              "invalid_request_error",
              "content_filter",
            );
          else if (p.case === "error" && p.value.frameId === opts.frameId)
            throw apiErrorOf({ code: Status[p.value.code as keyof typeof Status], details: p.value.message });
          if (!turnId) continue;
        }
        // A replay's gap belongs to no turn; the run's reader needs it (its deltas have a hole).
        if (event.turnId !== turnId && p.case !== "gap") continue;
        yield event;
        if (p.case === "agentEnd") return;
      }
    } catch (err) {
      if (err instanceof ApiError) throw err;
      if (opts.signal.aborted || !resumable(err)) throw err;
      lostSince ??= Date.now();
      const lostMs = Date.now() - lostSince;
      if (lostMs > (opts.resumeForMs ?? RESUME_FOR_MS)) throw err;
      await new Promise((r) => setTimeout(r, resumeDelayMs(lostMs)));
      continue;
    }
    throw new ApiError(503, "the session's event stream ended before its run did", "server_error");
  }
}
