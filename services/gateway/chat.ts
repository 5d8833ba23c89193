// The Chat stream: one client's bidirectional stream for one session. The first frame opens the
// session (placed by the router, which is part of this call's trace); the gateway then attaches to
// the session's runner and passes bytes both ways, decoding only what it must look at (the opened
// answer, what turn spans observe). Frames sent before the runner answered the open wait in order;
// over a limit the stream ends with RESOURCE_EXHAUSTED. A runner gone before it answered the open
// is tried once more where the session is placed now.
import { create } from "@bufbuild/protobuf";
import { context } from "@opentelemetry/api";
import { callerOf, identityOf, onBehalfOf } from "../shared/auth/auth.js";
import { Status, toStatus } from "../shared/errors.js";
import { catchStopCommand, stampDecider, validateFrame } from "../shared/frames.js";
import type { ChatRequest, ChatResponse } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { AttachResponse } from "../shared/gen/troupe/v1/runner_pb.js";
import { ClientFrameSchema, type ClientFrame } from "../shared/gen/troupe/v1/session_pb.js";
import { DEFAULT_AGENT } from "../shared/ids.js";
import { failure, type Logger } from "../shared/process/log.js";
import type { grpc } from "../shared/rpc.js";
import { extractContext } from "../shared/process/telemetry.js";
import type { GatewayLimits } from "./limits.js";
import {
  answerWithin,
  decodeRunnerResponse,
  leaveRunnerCall,
  needsDecoding,
  type AttachRequestInit,
} from "./passthrough.js";
import type { PlacementCache, RunnerPool } from "./placement.js";
import type { StreamsByKey } from "./revocation.js";
import { TurnSpans } from "./turn-spans.js";

export interface ChatDeps {
  placements: PlacementCache;
  runners: RunnerPool;
  limits: GatewayLimits;
  /** Streams by API key, so a revoked key's streams end. */
  streams: StreamsByKey;
  /** Draws a frame from the tenant's and session's budgets; throws RESOURCE_EXHAUSTED over one. */
  admit(tenant: string, sessionId: string, frame: ClientFrame): void;
  logger: Logger;
}

/** The Chat method: one call per client stream. */
export function chatHandler(deps: ChatDeps): (call: grpc.ServerDuplexStream<ChatRequest, ChatResponse>) => void {
  const { placements, runners, limits, streams, admit, logger } = deps;
  return (call) => {
    // The call's own span: placing the session (the router) and attaching are part of its trace.
    const chatContext = context.active();
    let state: "awaiting-open" | "opening" | "open" | "done" = "awaiting-open";
    let runnerCall: grpc.ClientDuplexStream<AttachRequestInit, Buffer> | undefined;
    const queued: ClientFrame[] = [];
    let halfClosed = false;
    let sessionId = "";
    let agentId = DEFAULT_AGENT;
    const spans = new TurnSpans(
      extractContext(call.metadata),
      () => sessionId,
      () => agentId,
    );
    const caller = onBehalfOf(call);
    const who = identityOf(call.metadata);
    const tenant = who.tenant;
    let releaseStream: (() => void) | undefined;
    const unwatch = streams.add(callerOf(call.metadata).keyHash, (err) => finish(err));

    const finish = (err?: unknown) => {
      if (state === "done") return;
      state = "done";
      unwatch();
      spans.endAll();
      releaseStream?.();
      if (err !== undefined && toStatus(err).code === Status.INTERNAL) logger.error("chat stream failed", failure(err));
      if (err !== undefined) {
        runnerCall?.cancel();
        if (!call.cancelled) call.emit("error", toStatus(err));
      } else if (!call.cancelled) call.end();
    };
    const forward = (frame: ClientFrame) => {
      if (!runnerCall!.write({ frame })) {
        call.pause();
        runnerCall!.once("drain", () => call.resume());
      }
    };

    const open = async (openFrame: ClientFrame, attempt: number): Promise<void> => {
      const o = openFrame.kind.case === "open" ? openFrame.kind.value : undefined;
      const placement = await placements.resolve(who, o?.sessionId ?? "", o?.agentId ?? "");
      sessionId = placement.sessionId;
      agentId = placement.agentId;
      // A session the router named for us is new: the runner must create it.
      const frame = o?.sessionId
        ? openFrame
        : create(ClientFrameSchema, {
            ...openFrame,
            kind: { case: "open", value: { ...o!, sessionId, create: true } },
          });
      const rc = runners.attach(placement.runner!.address, caller);
      runnerCall = rc;
      const answer = answerWithin(rc);
      rc.on("data", (bytes: Buffer) => {
        answer.heard();
        if (state === "done") return;
        if (needsDecoding(bytes)) {
          let resp: AttachResponse;
          try {
            resp = decodeRunnerResponse(bytes);
          } catch (err) {
            finish(err);
            return;
          }
          if (resp.kind.case === "opened") {
            agentId = resp.kind.value.agentId;
            state = "open";
            for (const f of queued.splice(0)) forward(f);
            if (halfClosed) rc.end();
          }
          spans.observe(resp);
        }
        if (!call.write(bytes as never)) {
          rc.pause();
          call.once("drain", () => rc.resume());
        }
      });
      let upstreamFailed = false;
      rc.on("error", (error) => {
        upstreamFailed = true;
        const err = answer.error(error);
        if (!answer.answered && attempt === 0 && state !== "done" && placements.reroute(who, sessionId, err)) {
          open(openFrame, 1).catch(finish);
          return;
        }
        finish(err);
      });
      // grpc-js may end the readable side of a call that failed too: only a clean end is one.
      rc.on("end", () => {
        if (!upstreamFailed) finish();
      });
      rc.write({ frame });
    };

    call.on("data", (req: ChatRequest) => {
      try {
        const frame = req.frame;
        if (state === "done") return;
        if (state === "awaiting-open") {
          validateFrame(frame, false, true);
          releaseStream = limits.openStream(tenant);
          state = "opening";
          context.with(chatContext, () => open(frame, 0)).catch(finish);
          return;
        }
        validateFrame(frame, true, true);
        const stopAware = stampDecider(catchStopCommand(frame), who.principal);
        // Over a limit, the stream ends with RESOURCE_EXHAUSTED and when to retry; frames not
        // yet acknowledged are the client's to resend, as after any broken stream.
        admit(tenant, sessionId, stopAware);
        const traced = spans.start(stopAware);
        if (state === "opening") queued.push(traced);
        else forward(traced);
      } catch (err) {
        finish(err);
      }
    });
    // The client is done sending: pass that on once its frames are forwarded; the runner ends
    // the stream when the session has nothing left to do.
    call.on("end", () => {
      halfClosed = true;
      if (state === "open") runnerCall!.end();
      else if (state === "awaiting-open") finish();
    });
    call.on("cancelled", () => {
      state = "done";
      unwatch();
      spans.endAll();
      releaseStream?.();
      if (runnerCall) leaveRunnerCall(runnerCall);
    });
  };
}
