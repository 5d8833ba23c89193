// The Attach stream, the session's stream between a gateway and this runner: the open frame
// first (which opens or loads the session and subscribes the stream to its events), then frames
// in, events out; detach ends it cleanly, the gateway's half-close once the session is idle.
import { create } from "@bufbuild/protobuf";
import { context } from "@opentelemetry/api";
import { identityOf } from "../../shared/auth/auth.js";
import { Status, resourceExhausted, toStatus, type RpcError } from "../../shared/errors.js";
import { validateFrame } from "../../shared/frames.js";
import { AttachResponseSchema, type AttachRequest } from "../../shared/gen/troupe/v1/runner_pb.js";
import type { AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { failure, type Logger } from "../../shared/process/log.js";
import type { grpc } from "../../shared/rpc.js";
import { attachEventBytes } from "../session/event-bytes.js";
import type { EventSubscriber } from "../session/event-journal.js";
import { FrameRefused } from "../session/mailbox.js";
import type { SessionActor } from "../session/session-actor.js";
import type { SessionRegistry } from "../session/session-registry.js";

/** A subscriber that stops taking events for this long is cut off (it can resume by seq). */
const SLOW_SUBSCRIBER_MS = 30_000;

/** Writes events to one gRPC stream, and reports when the stream is full. */
class StreamSubscriber<M> implements EventSubscriber {
  private waiting?: Promise<void>;
  private closed = false;
  private lastSeq = 0;

  constructor(
    private readonly call: grpc.ServerWritableStream<unknown, M> | grpc.ServerDuplexStream<unknown, M>,
    private readonly wrap: (event: AgentEvent) => M,
  ) {
    const close = () => (this.closed = true);
    call.once("cancelled", close);
    call.once("close", close);
  }

  send(event: AgentEvent): void {
    if (this.closed || this.call.writableEnded) return;
    this.lastSeq = Number(event.seq);
    if (this.call.write(this.wrap(event)) || this.waiting) return;
    this.waiting = new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.call.removeListener("drain", done);
        this.call.removeListener("close", done);
        this.waiting = undefined;
        resolve();
      };
      const timer = setTimeout(() => {
        this.closed = true;
        const status = toStatus(
          resourceExhausted(
            `this stream stopped reading for ${SLOW_SUBSCRIBER_MS} ms; resume with Subscribe(after_seq=${this.lastSeq})`,
          ),
        );
        this.call.emit("error", status);
        done();
      }, SLOW_SUBSCRIBER_MS);
      this.call.once("drain", done);
      this.call.once("close", done);
    });
  }

  pressure(): Promise<void> | undefined {
    return this.closed ? undefined : this.waiting;
  }

  close(err: RpcError): void {
    if (this.closed) return;
    this.closed = true;
    this.call.emit("error", toStatus(err));
  }
}

/** RunnerService.Attach over the runner's sessions. */
export function attachHandler(
  registry: SessionRegistry,
  logger: Logger,
): (call: grpc.ServerDuplexStream<AttachRequest, unknown>) => void {
  return (call) => {
    let opened: Promise<SessionActor> | undefined;
    let subscriber: StreamSubscriber<unknown> | undefined;
    let failed = false;
    let detached = false;
    const inflight = new Set<Promise<unknown>>();
    const fail = (err: unknown) => {
      if (failed || detached || call.cancelled) return;
      failed = true;
      if (toStatus(err).code === Status.INTERNAL) logger.error("session stream failed", failure(err));
      call.emit("error", toStatus(err));
    };
    const detach = () => {
      if (opened && subscriber) {
        const sub = subscriber;
        opened.then(
          (actor) => actor.detach(sub),
          () => undefined,
        );
      }
    };
    call.on("data", (req: AttachRequest) => {
      try {
        if (req.detach) {
          // The client left: end cleanly (no reset); the session itself goes on.
          detached = true;
          detach();
          if (!failed && !call.cancelled) call.end();
          return;
        }
        const frame = req.frame;
        if (!opened) {
          validateFrame(frame, false);
          if (frame.kind.case !== "open") return;
          const open = frame.kind.value;
          opened = registry
            .open(open, identityOf(call.metadata), frame.frameId)
            .then(async ({ actor, opened: info }) => {
              if (detached) return actor;
              call.write(create(AttachResponseSchema, { kind: { case: "opened", value: info } }));
              // Bytes already encoded: the adapter writes them as they are (event-bytes.ts).
              subscriber = new StreamSubscriber(
                call as unknown as grpc.ServerDuplexStream<unknown, Uint8Array>,
                attachEventBytes,
              );
              await actor.attach(
                subscriber,
                open.replayAfterSeq === undefined ? undefined : Number(open.replayAfterSeq),
              );
              if (detached) actor.detach(subscriber);
              return actor;
            });
          opened.catch(fail);
          return;
        }
        validateFrame(frame, true);
        const traceContext = context.active();
        const admitted = opened.then((actor) => actor.submit(frame, traceContext));
        inflight.add(admitted);
        // A refused frame does not end the stream: the session already told it why, by event.
        admitted.catch((err) => err instanceof FrameRefused || fail(err)).finally(() => inflight.delete(admitted));
      } catch (err) {
        fail(err);
      }
    });
    // The gateway half-closes when its client does: finish once the session has nothing left to do.
    call.on("end", () => {
      if (detached) return;
      (opened ?? Promise.reject(new Error("no open frame")))
        .then(async (actor) => {
          // Frames sent just before the half-close are admitted first, so their runs count.
          await Promise.allSettled(inflight);
          await actor.whenIdle();
        })
        .then(
          () => !failed && !call.cancelled && !detached && call.end(),
          () => !failed && !call.cancelled && !detached && call.end(),
        );
    });
    call.on("cancelled", detach);
    call.on("close", detach);
  };
}
