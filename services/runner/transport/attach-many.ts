// RunnerService.AttachMany: many Attach streams on one call. Each sub-stream is handed to the
// Attach handler as a call of its own (a SubStreamCall: the part of a grpc-js server stream that
// handler and its span wrapper use), so a sub-stream means exactly what an Attach call means.
// What the sub-streams write in one turn of the event loop leaves as one message: at a real
// model's pace a session's tokens arrive one at a time, and a gRPC message per token on this hop
// cost more than everything else the gateway does (bench/stream-floor).
//
// Flow control: a sub-stream may run SUB_STREAM_WINDOW bytes ahead of what the gateway credited
// back (what it passed on to its client); past that its writes report a full stream and 'drain'
// follows the credit, as HTTP/2's window does for an Attach call. The call itself is always read.
import { EventEmitter } from "node:events";
import { RpcError, Status } from "../../shared/errors.js";
import {
  type AttachManyRequest,
  type AttachResponse,
  AttachResponseSchema,
} from "../../shared/gen/troupe/v1/runner_pb.js";
import type { Logger } from "../../shared/process/log.js";
import { grpc } from "../../shared/rpc.js";
import type { CallContext } from "../../shared/rpc/call-context.js";
import { Channel } from "../../shared/rpc/channel.js";
import { serialize } from "../../shared/rpc/definition.js";
import { endItem, metadataOf, metadataRecord, responseHead } from "../../shared/sub-streams.js";

/** What grpc-js's serializer does for an Attach call: bytes as they are, a message encoded. */
const encodeResponse = serialize(AttachResponseSchema);

/** How far a sub-stream's responses may run ahead of the gateway's credit, in bytes. */
export const SUB_STREAM_WINDOW = 1 << 20;
/** Sub-streams one call may hold at once (a gateway has one call per runner). */
export const MAX_SUB_STREAMS = 100_000;

/** A message of gathered responses is sent once it reaches this size (the limit is the call's max). */
const BATCH_BYTES = 256 * 1024;
/** What a response item adds around an AttachResponse: tags, lengths, the sub-stream's number. */
const ITEM_OVERHEAD = 16;

/** Responses of every sub-stream, gathered and written once per turn of the event loop. */
class Outbox {
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  constructor(
    /** The call's responses; unbounded, as the sub-streams' windows bound what they hold. */
    private readonly out: Channel<Buffer>,
    /** No message over this: BATCH_BYTES, or the call's limit where that is smaller. */
    private readonly limit: number,
  ) {}
  /** Adds an item: `head` and, for a response, the response's bytes after it (responseHead). */
  add(head: Buffer, body?: Uint8Array): void {
    const size = head.length + (body?.length ?? 0);
    if (this.pendingBytes > 0 && this.pendingBytes + size > this.limit) this.flush();
    if (this.pending.length === 0) setImmediate(() => this.flush());
    this.pending.push(head);
    if (body) this.pending.push(body);
    this.pendingBytes += size;
  }
  private flush(): void {
    if (this.pending.length === 0) return;
    const items = this.pending;
    this.pending = [];
    this.pendingBytes = 0;
    this.out.push(items.length === 1 ? (items[0] as Buffer) : Buffer.concat(items));
  }
}

/** One sub-stream, as the Attach handler sees a call. */
class SubStreamCall extends EventEmitter {
  cancelled = false;
  writableEnded = false;
  private ahead = 0;
  private full = false;

  constructor(
    readonly metadata: grpc.Metadata,
    private readonly id: number,
    private readonly outbox: Outbox,
    /** The largest message the call may carry: a response that would not fit fails this sub-stream only. */
    private readonly maxMessageBytes: number,
    private readonly forget: () => void,
  ) {
    super();
    // As grpc-js's server streams: emitting 'error' with a status ends the call with it.
    this.on("error", (err: { code?: unknown; details?: unknown; message?: unknown; metadata?: unknown }) => {
      const trailers = err.metadata instanceof grpc.Metadata ? metadataRecord(err.metadata) : {};
      this.finish(
        typeof err.code === "number" ? err.code : Status.UNKNOWN,
        String(err.details ?? err.message ?? "unknown error"),
        trailers,
      );
    });
  }

  /** An AttachResponse, or its bytes already encoded (event-bytes.ts), as grpc-js's serializer takes either. */
  write(message: Uint8Array | AttachResponse): boolean {
    if (this.writableEnded || this.cancelled) return false;
    const bytes = encodeResponse(message);
    if (bytes.length + ITEM_OVERHEAD > this.maxMessageBytes) {
      // As grpc-js fails a call whose message is over the limit: this stream, not the others.
      this.emit("error", {
        code: Status.RESOURCE_EXHAUSTED,
        details: `Sent message larger than max (${bytes.length} vs. ${this.maxMessageBytes - ITEM_OVERHEAD})`,
      });
      return false;
    }
    this.outbox.add(responseHead(this.id, bytes.length), bytes);
    this.ahead += bytes.length;
    if (this.ahead < SUB_STREAM_WINDOW) return true;
    this.full = true;
    return false;
  }

  end(): void {
    this.finish(Status.OK, "");
  }

  /** The gateway passed on `bytes` more of this sub-stream's responses. */
  credit(bytes: number): void {
    this.ahead -= bytes;
    if (this.full && this.ahead < SUB_STREAM_WINDOW) {
      this.full = false;
      this.emit("drain");
    }
  }

  /** The gateway cancelled it, or the call is gone. */
  cancel(): void {
    if (this.cancelled || this.writableEnded) return;
    this.cancelled = true;
    this.forget();
    this.emit("cancelled");
    this.emit("close");
  }

  private finish(code: number, details: string, trailers: Record<string, string> = {}): void {
    if (this.writableEnded || this.cancelled) return;
    this.writableEnded = true;
    this.forget();
    this.outbox.add(endItem(this.id, code, details, trailers));
    this.emit("finish");
    process.nextTick(() => this.emit("close"));
  }
}

/**
 * AttachMany over `attach`, the Attach handler as the server wraps it (its span and metrics per
 * sub-stream). A request that opens a sub-stream twice or opens too many fails the call (requests
 * that do not parse are refused before this, by the adapter): only a gateway holds the internal
 * token, so that is a fault to report, not a tenant's input.
 */
export function attachManyHandler(
  attach: (call: grpc.ServerDuplexStream<unknown, unknown>) => void,
  logger: Logger,
  maxMessageBytes: number,
): (requests: AsyncIterable<AttachManyRequest>, ctx: CallContext) => AsyncIterable<Buffer> {
  return (requests, ctx) => {
    const out = new Channel<Buffer>(Number.POSITIVE_INFINITY);
    const outbox = new Outbox(out, Math.min(BATCH_BYTES, maxMessageBytes));
    const subs = new Map<number, SubStreamCall>();
    const endAll = () => {
      for (const sub of [...subs.values()]) sub.cancel();
    };
    // The gateway ends the call only when it has no sub-stream left; whatever is left is cancelled.
    ctx.signal.addEventListener("abort", endAll, { once: true });
    const refuse = (why: string) => {
      logger.error("AttachMany: a gateway sent what it must not", { why });
      throw new RpcError(Status.INVALID_ARGUMENT, why);
    };
    // Headers at once: the gateway holds its sub-streams' frames until the call is accepted.
    ctx.sendHeader();
    const serve = async () => {
      for await (const req of requests) {
        for (const item of req.items) {
          const sub = subs.get(item.stream);
          switch (item.kind.case) {
            case "open": {
              if (sub) refuse(`sub-stream ${item.stream} opened twice`);
              if (subs.size >= MAX_SUB_STREAMS) refuse(`over ${MAX_SUB_STREAMS} sub-streams on one call`);
              const opened = new SubStreamCall(
                metadataOf(item.kind.value.metadata),
                item.stream,
                outbox,
                maxMessageBytes,
                () => subs.delete(item.stream),
              );
              subs.set(item.stream, opened);
              attach(opened as unknown as grpc.ServerDuplexStream<unknown, unknown>);
              break;
            }
            case "request":
              sub?.emit("data", item.kind.value);
              break;
            case "halfClose":
              sub?.emit("end");
              break;
            case "cancel":
              sub?.cancel();
              break;
            case "credit":
              sub?.credit(item.kind.value);
              break;
            default:
              refuse(`sub-stream ${item.stream}: an item with nothing in it`);
          }
        }
      }
      endAll();
      out.end();
    };
    serve().catch((err) => {
      endAll();
      out.fail(err);
    });
    return out;
  };
}
