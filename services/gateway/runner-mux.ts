// The gateway's side of RunnerService.AttachMany: one call per runner carries every client
// stream's session stream to it, as numbered sub-streams (services/runner/transport/attach-many.ts),
// the only way session streams reach a runner. A SubStream has the part of grpc-js's client
// stream chat.ts and the inboxes use: write, end, cancel, pause and resume; data, error, end and
// status events.
//
// What the sub-streams send in one turn of the event loop leaves as one message, and so do the
// credits: what a sub-stream has passed on to its client, so that the runner may send more.
import { EventEmitter } from "node:events";
import { ROOT_CONTEXT, context } from "@opentelemetry/api";
import { Status } from "../shared/errors.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type {
  AttachManyRequest,
  RunnerService,
  SubStreamRequestSchema,
  SubStreamStatus,
} from "../shared/gen/troupe/v1/runner_pb.js";
import { grpc, type ServiceClient } from "../shared/rpc.js";
import { metadataOf, metadataRecord, readBatch } from "../shared/sub-streams.js";
import { endClientSpan, startClientSpan } from "../shared/rpc/client.js";
import { injectContext, spanContext } from "../shared/process/telemetry.js";
import type { AttachRequestInit, RunnerCall } from "./passthrough.js";

type RunnerClient = ServiceClient<(typeof RunnerService)["method"]>;
type ItemInit = MessageInitShape<typeof SubStreamRequestSchema>;

/** Credit is returned once a sub-stream has passed on this many bytes (the runner's window is 1 MiB). */
const CREDIT_EVERY = 64 * 1024;
/** New sub-streams go on a fresh call once the current one is this old (servers cap a connection's age). */
const ROTATE_AFTER_MS = 10 * 60_000;
const ATTACH_PATH = "troupe.v1.RunnerService/Attach";

function serviceError(status: { code: number; details: string; metadata?: grpc.Metadata }): grpc.ServiceError {
  const err = new Error(`${status.code} ${Status[status.code] ?? ""}: ${status.details}`) as grpc.ServiceError;
  err.code = status.code;
  err.details = status.details;
  err.metadata = status.metadata ?? new grpc.Metadata();
  return err;
}

/** One session stream on a runner's AttachMany call. */
class SubStream extends EventEmitter {
  private paused = false;
  private readonly queued: (Buffer | grpc.StatusObject)[] = [];
  private uncredited = 0;
  private done = false;
  private readonly span = startClientSpan(ATTACH_PATH);

  constructor(
    private readonly id: number,
    private readonly carrier: MuxCall,
    metadata: grpc.Metadata,
  ) {
    super();
    const md = metadata.clone();
    injectContext(spanContext(context.active(), this.span), md);
    this.send({ case: "open", value: { metadata: metadataRecord(md) } });
  }

  write(req: AttachRequestInit): boolean {
    if (!this.done) this.send({ case: "request", value: req });
    return true;
  }

  end(): void {
    if (!this.done) this.send({ case: "halfClose", value: true });
  }

  cancel(): void {
    if (this.done) return;
    this.send({ case: "cancel", value: true });
    this.close({ code: Status.CANCELLED, details: "Cancelled on client", metadata: new grpc.Metadata() });
  }

  pause(): this {
    this.paused = true;
    return this;
  }

  resume(): this {
    this.paused = false;
    while (!this.paused && this.queued.length > 0) this.deliver(this.queued.shift()!);
    return this;
  }

  /** From the call: a response, or the sub-stream's end. */
  arrived(item: Buffer | grpc.StatusObject): void {
    if (this.done) return;
    if (this.paused || this.queued.length > 0) this.queued.push(item);
    else this.deliver(item);
  }

  private send(kind: ItemInit["kind"]): void {
    this.carrier.send({ stream: this.id, kind });
  }

  private deliver(item: Buffer | grpc.StatusObject): void {
    if (!Buffer.isBuffer(item)) {
      this.close(item);
      return;
    }
    this.uncredited += item.length;
    if (this.uncredited >= CREDIT_EVERY) {
      this.carrier.send({ stream: this.id, kind: { case: "credit", value: this.uncredited } });
      this.uncredited = 0;
    }
    this.emit("data", item);
  }

  /** Ends it with `status`, as grpc-js ends a call: status, then end (OK) or error. */
  close(status: grpc.StatusObject): void {
    if (this.done) return;
    this.done = true;
    this.queued.length = 0;
    this.carrier.forget(this.id);
    endClientSpan(this.span, status.code);
    this.emit("status", status);
    if (status.code === Status.OK) this.emit("end");
    else this.emit("error", serviceError(status));
  }
}

/** One AttachMany call and the sub-streams on it. */
class MuxCall {
  private readonly subs = new Map<number, SubStream>();
  private readonly call: grpc.ClientDuplexStream<AttachManyRequest | MessageInitShape<never>, Buffer>;
  private outgoing: ItemInit[] = [];
  private over = false;
  readonly startedMs = Date.now();

  constructor(
    client: RunnerClient,
    /** Told when this call can take no new sub-streams. */
    private readonly gone: () => void,
  ) {
    // Not part of any one session's trace: the call outlives the stream that opened it.
    this.call = context.with(ROOT_CONTEXT, () => client.attachMany()) as unknown as typeof this.call;
    this.call.on("data", (batch: Buffer) => {
      try {
        readBatch(batch, {
          response: (stream, bytes) => this.subs.get(stream)?.arrived(bytes),
          end: (stream, status) => this.subs.get(stream)?.arrived(statusOf(status)),
        });
      } catch (err) {
        this.fail({ code: Status.INTERNAL, details: `the runner sent a malformed AttachManyResponse: ${err}` });
        this.call.cancel();
      }
    });
    this.call.on("error", (err: grpc.ServiceError) => this.fail(err));
    this.call.on("end", () =>
      this.fail({ code: Status.UNAVAILABLE, details: "the runner ended the session streams' call" }),
    );
  }

  get open(): boolean {
    return !this.over && Date.now() - this.startedMs < ROTATE_AFTER_MS;
  }

  attach(id: number, metadata: grpc.Metadata): SubStream {
    const sub = new SubStream(id, this, metadata);
    this.subs.set(id, sub);
    return sub;
  }

  send(item: ItemInit): void {
    if (this.over) return;
    if (this.outgoing.length === 0) setImmediate(() => this.flush());
    this.outgoing.push(item);
  }

  forget(id: number): void {
    this.subs.delete(id);
    // A call that takes no new sub-streams ends with its last one.
    if (!this.open) this.retire();
  }

  /** Takes no new sub-streams: ends now if it has none, else with its last one. */
  retire(): void {
    if (this.subs.size > 0 || this.over) return;
    this.over = true;
    setImmediate(() => this.call.end());
  }

  /** Ends the call now; sub-streams still on it fail CANCELLED. */
  cancel(): void {
    this.call.cancel();
  }

  private flush(): void {
    const items = this.outgoing;
    this.outgoing = [];
    if (this.over && items.length === 0) return;
    this.call.write({ items } as never);
  }

  /** The call failed or ended: every sub-stream on it ends with its status (clients reattach). */
  private fail(err: { code: number; details: string }): void {
    this.over = true;
    this.gone();
    const subs = [...this.subs.values()];
    this.subs.clear();
    for (const sub of subs) sub.close({ code: err.code, details: err.details, metadata: new grpc.Metadata() });
  }
}

function statusOf(s: SubStreamStatus): grpc.StatusObject {
  return { code: s.code, details: s.details, metadata: metadataOf(s.trailers) };
}

/** Session streams to one runner, on its AttachMany call (a new one once the last is retired). */
export class RunnerMux {
  private current?: MuxCall;
  private nextId = 1;

  constructor(private readonly client: RunnerClient) {}

  /** A session stream to this runner for a caller (`metadata`: the identity it acts for). */
  attach(metadata: grpc.Metadata): RunnerCall {
    if (!this.current?.open) {
      this.current?.retire();
      const call = new MuxCall(this.client, () => {
        if (this.current === call) this.current = undefined;
      });
      this.current = call;
    }
    const id = this.nextId;
    this.nextId = this.nextId >= 0xfffffff0 ? 1 : this.nextId + 1;
    return this.current.attach(id, metadata) as unknown as RunnerCall;
  }

  /**
   * The gateway is going (after its drain): the call ends now, so the runner's side lets go of it
   * at once, and the connection can close. Streams attached later get a call of their own.
   */
  close(): void {
    const call = this.current;
    this.current = undefined;
    call?.cancel();
  }
}
