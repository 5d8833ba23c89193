// The Attach stream, the session's stream between a gateway and this runner: the open frame
// first (which opens or loads the session and subscribes the stream to its events), then frames
// in, events out; detach ends it cleanly, the gateway's half-close once the session is idle.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { context } from "@opentelemetry/api";
import { identityOf } from "../../shared/auth/auth.js";
import { resourceExhausted, type RpcError } from "../../shared/errors.js";
import { validateFrame } from "../../shared/frames.js";
import { AttachResponseSchema, type AttachRequest } from "../../shared/gen/troupe/v1/runner_pb.js";
import type { AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import type { CallContext } from "../../shared/rpc/call-context.js";
import { BYTES_MARK, byteLength, Channel } from "../../shared/rpc/channel.js";
import { attachEventBytes } from "../session/event-bytes.js";
import type { EventSubscriber } from "../session/event-journal.js";
import { FrameRefused } from "../session/mailbox.js";
import type { SessionActor } from "../session/session-actor.js";
import type { SessionRegistry } from "../session/session-registry.js";

/** A subscriber that stops taking events for this long is cut off (it can resume by seq). */
const SLOW_SUBSCRIBER_MS = 30_000;

/** What the stream sends: the open answer, then events already encoded (event-bytes.ts). */
type AttachOut = Uint8Array | MessageInitShape<typeof AttachResponseSchema>;

/** Hands a session's events to the stream's responses, and reports while they are full. */
class ChannelSubscriber implements EventSubscriber {
  private waiting?: Promise<void>;
  private lastSeq = 0;

  constructor(
    private readonly out: Channel<AttachOut>,
    private readonly ctx: CallContext,
  ) {}

  send(event: AgentEvent): void {
    if (this.out.closed) return;
    this.lastSeq = Number(event.seq);
    if (this.out.push(attachEventBytes(event)) || this.waiting) return;
    // A reader that took nothing for SLOW_SUBSCRIBER_MS is cut at once, what is queued with it.
    const timer = setTimeout(
      () =>
        this.ctx.fail(
          resourceExhausted(
            `this stream stopped reading for ${SLOW_SUBSCRIBER_MS} ms; resume with Subscribe(after_seq=${this.lastSeq})`,
          ),
        ),
      SLOW_SUBSCRIBER_MS,
    );
    this.waiting = this.out.room()?.then(() => {
      clearTimeout(timer);
      this.waiting = undefined;
    });
  }

  pressure(): Promise<void> | undefined {
    return this.out.closed ? undefined : this.waiting;
  }

  /** What was sent before still reaches the reader; then the stream ends with `err`. */
  close(err: RpcError): void {
    this.out.end(err);
  }
}

/** RunnerService.Attach over the runner's sessions. */
export function attachHandler(
  registry: SessionRegistry,
): (requests: AsyncIterable<AttachRequest>, ctx: CallContext) => AsyncIterable<AttachOut> {
  return (requests, ctx) => {
    // Weighed in bytes: a coalesced delta is up to 16 KB, and the window ahead of this is 1 MiB.
    const out = new Channel<AttachOut>(BYTES_MARK, byteLength);
    const subscriber = new ChannelSubscriber(out, ctx);
    let opened: Promise<SessionActor> | undefined;
    const inflight = new Set<Promise<unknown>>();
    // Unexpected failures are logged where every handler's are (rpc/server.ts).
    const fail = (err: unknown) => out.closed || out.fail(err);
    // The call is over (detached, ended, failed or cancelled): the session goes on without it.
    ctx.signal.addEventListener(
      "abort",
      () =>
        opened?.then(
          (actor) => actor.detach(subscriber),
          () => undefined,
        ),
      { once: true },
    );
    const serve = async () => {
      for await (const req of requests) {
        // The client left: end cleanly (no reset); the session itself goes on.
        if (req.detach) return out.end();
        const frame = req.frame;
        if (!opened) {
          validateFrame(frame, false);
          if (frame.kind.case !== "open") continue;
          const open = frame.kind.value;
          opened = registry
            .open(open, identityOf(ctx.metadata), frame.frameId)
            .then(async ({ actor, opened: info }) => {
              if (out.closed) return actor;
              out.push(create(AttachResponseSchema, { kind: { case: "opened", value: info } }));
              await actor.attach(
                subscriber,
                open.replayAfterSeq === undefined ? undefined : Number(open.replayAfterSeq),
              );
              if (ctx.signal.aborted) actor.detach(subscriber);
              return actor;
            });
          opened.catch(fail);
          continue;
        }
        validateFrame(frame, true);
        const traceContext = context.active();
        const admitted = opened.then((actor) => actor.submit(frame, traceContext));
        inflight.add(admitted);
        // A refused frame does not end the stream: the session already told it why, by event.
        admitted.catch((err) => err instanceof FrameRefused || fail(err)).finally(() => inflight.delete(admitted));
      }
      if (ctx.signal.aborted) return;
      // The gateway half-closes when its client does: end once the session has nothing left to
      // do. Frames sent just before the half-close are admitted first, so their runs count.
      const actor = await opened?.catch(() => undefined);
      if (actor) {
        await Promise.allSettled(inflight);
        await actor.whenIdle();
      }
      out.end();
    };
    serve().catch(fail);
    return out;
  };
}
