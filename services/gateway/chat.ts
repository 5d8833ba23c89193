// The Chat stream: one client's bidirectional stream for one session. The first frame opens the
// session (placed by the router, which is part of this call's trace); the gateway then attaches to
// the session's runner and passes bytes both ways, decoding only what it must look at (the opened
// answer, what turn spans observe). Frames sent before the runner answered the open wait in order;
// over a limit the stream ends with RESOURCE_EXHAUSTED. A runner gone before it answered the open
// is tried once more where the session is placed now.
import { create } from "@bufbuild/protobuf";
import { context } from "@opentelemetry/api";
import { callerOf, identityOf, onBehalfOf } from "../shared/auth/auth.js";
import { catchStopCommand, stampDecider, validateFrame } from "../shared/frames.js";
import type { ChatRequest } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { AttachResponse } from "../shared/gen/troupe/v1/runner_pb.js";
import { ClientFrameSchema, type ClientFrame } from "../shared/gen/troupe/v1/session_pb.js";
import { DEFAULT_AGENT } from "../shared/ids.js";
import type { CallContext } from "../shared/rpc/call-context.js";
import { BYTES_MARK, byteLength, Channel } from "../shared/rpc/channel.js";
import { extractContext } from "../shared/process/telemetry.js";
import type { GatewayLimits } from "./limits.js";
import { decodeRunnerResponse, needsDecoding, relayRunner, type RunnerRelay } from "./passthrough.js";
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
}

/** The Chat method: one call per client stream. */
export function chatHandler(
  deps: ChatDeps,
): (requests: AsyncIterable<ChatRequest>, ctx: CallContext) => Channel<Buffer> {
  const { placements, runners, limits, streams, admit } = deps;
  return (requests, ctx) => {
    // The call's own span: placing the session (the router) and attaching are part of its trace.
    const chatContext = context.active();
    // The runner's responses are the client's (passthrough.ts): bytes, passed on as they are.
    const out = new Channel<Buffer>(BYTES_MARK, byteLength);
    let runner: RunnerRelay | undefined;
    /** Frames that came before the runner answered the open, in order. */
    let queued: ClientFrame[] | undefined = [];
    let halfClosed = false;
    let sessionId = "";
    let agentId = DEFAULT_AGENT;
    const spans = new TurnSpans(
      extractContext(ctx.metadata),
      () => sessionId,
      () => agentId,
    );
    const caller = onBehalfOf(ctx);
    const who = identityOf(ctx.metadata);
    const tenant = who.tenant;
    let releaseStream: (() => void) | undefined;
    const unwatch = streams.add(callerOf(ctx.metadata).keyHash, (err) => out.fail(err));
    // The call is over, however it ended: let go of what it held, and of the runner's stream.
    ctx.signal.addEventListener(
      "abort",
      () => {
        unwatch();
        spans.endAll();
        releaseStream?.();
        runner?.leave();
      },
      { once: true },
    );

    const open = async (openFrame: ClientFrame, attempt: number): Promise<void> => {
      const o = openFrame.kind.case === "open" ? openFrame.kind.value : undefined;
      const placement = await placements.resolve(who, o?.sessionId ?? "", o?.agentId ?? "");
      if (out.closed) return;
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
      const pass = (bytes: Buffer): Buffer | undefined => {
        if (!needsDecoding(bytes)) return bytes;
        let resp: AttachResponse;
        try {
          resp = decodeRunnerResponse(bytes);
        } catch (err) {
          out.fail(err);
          return undefined;
        }
        if (resp.kind.case === "opened" && queued) {
          agentId = resp.kind.value.agentId;
          for (const f of queued) rc.write({ frame: f });
          queued = undefined;
          if (halfClosed) rc.end();
        }
        spans.observe(resp);
        return bytes;
      };
      const reroute = (err: unknown) => {
        if (attempt > 0 || !placements.reroute(who, sessionId, err)) return false;
        open(openFrame, 1).catch((e) => out.fail(e));
        return true;
      };
      runner = relayRunner(rc, out, pass, reroute);
      rc.write({ frame });
    };

    const serve = async () => {
      let opening = false;
      for await (const req of requests) {
        const frame = req.frame;
        if (!opening) {
          validateFrame(frame, false, true);
          releaseStream = limits.openStream(tenant);
          opening = true;
          context.with(chatContext, () => open(frame, 0)).catch((err) => out.fail(err));
          continue;
        }
        validateFrame(frame, true, true);
        const stopAware = stampDecider(catchStopCommand(frame), who.principal);
        // Over a limit, the stream ends with RESOURCE_EXHAUSTED and when to retry; frames not
        // yet acknowledged are the client's to resend, as after any broken stream.
        admit(tenant, sessionId, stopAware);
        const traced = spans.start(stopAware);
        if (queued) queued.push(traced);
        // A sub-stream takes every frame (runner-mux.ts); the budgets above bound them.
        else runner!.call.write({ frame: traced });
      }
      if (ctx.signal.aborted) return;
      // The client is done sending: pass that on once its frames are forwarded; the runner ends
      // the stream when the session has nothing left to do.
      halfClosed = true;
      if (!opening) out.end();
      else if (!queued) runner!.call.end();
    };
    serve().catch((err) => out.fail(err));
    return out;
  };
}
