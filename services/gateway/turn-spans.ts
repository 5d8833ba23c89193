// The invoke_agent span of each turn a client starts through the gateway.
import { create } from "@bufbuild/protobuf";
import { SpanKind, trace, type Context, type Span } from "@opentelemetry/api";
import type { AttachResponse } from "../shared/gen/troupe/v1/runner_pb.js";
import { ClientFrameSchema, type ClientFrame } from "../shared/gen/troupe/v1/session_pb.js";
import { GenAI, contextToRecord, tracer } from "../shared/process/telemetry.js";

/**
 * One span per turn the client starts, named invoke_agent as the GenAI conventions say for a
 * remote agent call. Its context travels inside the frame, so the runner's spans join it.
 */
export class TurnSpans {
  private readonly byFrame = new Map<string, Span>();
  private readonly byTurn = new Map<string, Span>();
  constructor(
    private readonly parent: Context,
    private readonly sessionId: () => string,
    private readonly agentId: () => string,
  ) {}

  /** Returns the frame with trace context added. */
  start(frame: ClientFrame): ClientFrame {
    const kind = frame.kind.case;
    if (kind !== "prompt" && kind !== "followUp" && kind !== "steer") return frame;
    const span = tracer.startSpan(
      `invoke_agent ${this.agentId()}`,
      {
        kind: SpanKind.CLIENT,
        attributes: {
          [GenAI.OPERATION_NAME]: "invoke_agent",
          [GenAI.AGENT_ID]: this.agentId(),
          [GenAI.CONVERSATION_ID]: this.sessionId(),
        },
      },
      this.parent,
    );
    this.byFrame.set(frame.frameId, span);
    return create(ClientFrameSchema, { ...frame, traceContext: contextToRecord(trace.setSpan(this.parent, span)) });
  }

  observe(resp: AttachResponse): void {
    if (resp.kind.case !== "event" || this.byFrame.size + this.byTurn.size === 0) return;
    const ev = resp.kind.value;
    const p = ev.payload;
    if (p.case === "agentStart") {
      const span = this.byFrame.get(p.value.frameId);
      if (span) {
        this.byFrame.delete(p.value.frameId);
        this.byTurn.set(ev.turnId, span);
      }
    } else if (p.case === "agentEnd") {
      this.byTurn.get(ev.turnId)?.end();
      this.byTurn.delete(ev.turnId);
    } else if (p.case === "queueApplied") {
      // A steer or follow-up joined a run traced by its prompt's span: its own span ends here.
      // (A prompt's span was moved to byTurn at agent_start, which comes first.)
      this.byFrame.get(p.value.frameId)?.end();
      this.byFrame.delete(p.value.frameId);
    }
  }

  endAll(): void {
    for (const s of [...this.byFrame.values(), ...this.byTurn.values()]) s.end();
    this.byFrame.clear();
    this.byTurn.clear();
  }
}
