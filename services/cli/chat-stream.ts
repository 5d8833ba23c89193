// The Chat stream of `troupe chat`, kept across lost connections. A runner that dies mid-turn is
// restarted (troupe up) or replaced (another runner takes its sessions), and the run goes on
// there; a gateway can restart too. When the stream breaks that way (shared/resume-policy.ts),
// the session is opened again with replay_after_seq at the last event seen, and the frames not
// yet acknowledged are sent again: their ids make a second copy a duplicate, never a second turn
// (docs/architecture.md). A new session that never opened has no id to go back to, so a break
// before the first `opened` is final.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ClientFrameSchema, AgentEvent, QueueMode } from "../shared/gen/troupe/v1/session_pb.js";
import type { ChatResponse } from "../shared/gen/troupe/v1/gateway_pb.js";
import { RESUME_FOR_MS, resumable, resumeDelayMs } from "../shared/resume-policy.js";
import type { GatewayClient } from "./gateway-client.js";

type Frame = MessageInitShape<typeof ClientFrameSchema> & { frameId: string };
type Call = ReturnType<GatewayClient["chat"]>;
export type StreamError = Error & { code?: number; details?: string };

export interface ChatStreamOptions {
  open: { sessionId: string; agentId: string; queueMode: QueueMode; model: string };
  /** The session opened; `again`: after a lost connection. */
  onOpened(sessionId: string, again: boolean): void;
  /** Every event, once, in order. */
  onEvent(event: AgentEvent): void;
  /** The connection broke and is being made again (the first attempt of a run of them). */
  onLost(err: StreamError): void;
  /** How long to keep trying to reconnect, in all, before giving up (default 60 s). */
  reconnectForMs?: number;
}

export class ChatStream {
  private call?: Call;
  private sessionId = "";
  private lastSeq = 0n;
  /** Frames sent and not yet answered (accepted, or refused with an error naming them). */
  private readonly unanswered = new Map<string, Frame>();
  private ending = false;
  private cancelled = false;
  private lostSince?: number;
  private settle!: (err?: StreamError) => void;
  /** Resolves when the stream ends: without an error, or with the one that ended it. */
  readonly ended = new Promise<StreamError | undefined>((resolve) => (this.settle = resolve));

  constructor(
    private readonly client: GatewayClient,
    private readonly options: ChatStreamOptions,
  ) {
    this.connect();
  }

  /** Sends a frame now, and again after a reconnect until it is answered. */
  send(frame: Frame): void {
    this.unanswered.set(frame.frameId, frame);
    this.call?.write({ frame });
  }

  /** No more frames: the stream ends once the session has nothing left to do. */
  end(): void {
    this.ending = true;
    this.call?.end();
  }

  cancel(): void {
    this.cancelled = true;
    if (this.call) this.call.cancel();
    // Between connections (waiting to reconnect): nothing to cancel but the wait.
    else this.settle(Object.assign(new Error("cancelled"), { code: 1 }));
  }

  private connect(): void {
    if (this.cancelled) return;
    const again = this.sessionId !== "";
    const call = this.client.chat();
    this.call = call;
    const { open } = this.options;
    call.write({
      frame: {
        frameId: `open-${Date.now().toString(36)}`,
        kind: {
          case: "open",
          value: again
            ? { sessionId: this.sessionId, replayAfterSeq: this.lastSeq }
            : {
                sessionId: open.sessionId,
                agentId: open.agentId,
                create: true,
                queueMode: open.queueMode,
                model: open.model,
              },
        },
      },
    });
    for (const frame of this.unanswered.values()) call.write({ frame });
    if (this.ending) call.end();

    call.on("data", (resp: ChatResponse) => {
      if (resp.kind.case === "opened") {
        this.sessionId = resp.kind.value.sessionId;
        // Live events go on from here: a replay after a later break starts no earlier.
        if (!again && resp.kind.value.lastSeq > this.lastSeq) this.lastSeq = resp.kind.value.lastSeq;
        this.lostSince = undefined;
        this.options.onOpened(this.sessionId, again);
      } else if (resp.kind.case === "event") this.event(resp.kind.value);
    });
    call.on("error", (err: StreamError) => {
      if (this.call !== call) return;
      this.call = undefined;
      if (this.cancelled || !this.resumable(err)) return this.settle(err);
      if (this.lostSince === undefined) {
        this.lostSince = Date.now();
        this.options.onLost(err);
      }
      const waited = Date.now() - this.lostSince;
      if (waited > (this.options.reconnectForMs ?? RESUME_FOR_MS)) return this.settle(err);
      setTimeout(() => this.connect(), resumeDelayMs(waited));
    });
    call.on("end", () => this.call === call && this.settle(undefined));
  }

  private resumable(err: StreamError): boolean {
    return this.sessionId !== "" && resumable(err);
  }

  private event(ev: AgentEvent): void {
    // A replay starts after the last seq seen; this guards against a server that sends more.
    if (ev.seq !== 0n && ev.seq <= this.lastSeq) return;
    if (ev.seq > this.lastSeq) this.lastSeq = ev.seq;
    const p = ev.payload;
    if (p.case === "frameAccepted" || (p.case === "error" && p.value.frameId)) this.unanswered.delete(p.value.frameId);
    this.options.onEvent(ev);
  }
}
