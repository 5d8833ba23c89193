// Byte passthrough between a runner's Attach stream and a client's Chat or Subscribe stream: what
// the gateway must decode, how it leaves a runner's stream without a reset, and the one-byte change
// that turns an Attach event into a Subscribe event.
import type { MessageInitShape } from "@bufbuild/protobuf";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { SubscribeResponseSchema } from "../shared/gen/troupe/v1/gateway_pb.js";
import { AttachResponseSchema, type AttachRequestSchema } from "../shared/gen/troupe/v1/runner_pb.js";
import { AgentEventSchema } from "../shared/gen/troupe/v1/session_pb.js";
import type { grpc } from "../shared/rpc.js";
import { unavailable } from "../shared/errors.js";

// The runner's AttachResponse and the client's ChatResponse have the same fields under the same
// numbers, so the runner's bytes are the client's bytes: the gateway forwards them without
// decoding and re-encoding every token. It decodes only what it acts on: the open answer and the
// events that delimit turns for tracing. A SubscribeResponse is an AgentEvent under another field
// number, so an Attach event becomes one by changing its tag byte.
const OPENED = AttachResponseSchema.field.opened.number;
const EVENT = AttachResponseSchema.field.event.number;
const OBSERVED = new Set([
  AgentEventSchema.field.agentStart.number,
  AgentEventSchema.field.agentEnd.number,
  AgentEventSchema.field.queueApplied.number,
]);

/** Whether a runner response is one the gateway must look into; most are only forwarded. */
export function needsDecoding(bytes: Uint8Array): boolean {
  const r = new BinaryReader(bytes);
  while (r.pos < r.len) {
    const [no, wire] = r.tag();
    if (no === OPENED) return true;
    if (no === EVENT && wire === WireType.LengthDelimited) {
      const ev = new BinaryReader(r.bytes());
      while (ev.pos < ev.len) {
        const [field, w] = ev.tag();
        if (OBSERVED.has(field)) return true;
        ev.skip(w, field);
      }
      return false;
    }
    r.skip(wire, no);
  }
  return false;
}

export type AttachRequestInit = MessageInitShape<typeof AttachRequestSchema>;

/**
 * Leaves a runner's Attach stream without resetting it: `detach`, then half-close; the runner
 * ends the stream. HTTP/2 servers close a connection that resets streams too fast (nghttp2 allows
 * a burst of about 1,000), and one connection carries every client's stream to that runner, so a
 * wave of clients leaving must not become a wave of resets. A runner that does not answer within
 * 10 s is reset after all.
 */
export function leaveRunnerCall(rc: grpc.ClientDuplexStream<AttachRequestInit, unknown>): void {
  rc.on("error", () => undefined);
  try {
    rc.write({ detach: true });
    rc.end();
  } catch {
    rc.cancel();
    return;
  }
  rc.resume();
  const timer = setTimeout(() => rc.cancel(), 10_000);
  timer.unref();
  rc.once("status", () => clearTimeout(timer));
}

/**
 * An AttachResponse carrying an event, as the SubscribeResponse with that event: the event's bytes
 * are the same, only the field number differs (2 there, 1 here), so one tag byte changes. Anything
 * else (the `opened` answer) is not for a subscriber: undefined.
 */
export function asSubscribeResponse(bytes: Buffer): Buffer | undefined {
  const eventTag = (EVENT << 3) | WireType.LengthDelimited;
  if (bytes.length === 0 || bytes[0] !== eventTag) return undefined;
  const out = Buffer.from(bytes);
  out[0] = (SubscribeResponseSchema.field.event.number << 3) | WireType.LengthDelimited;
  return out;
}

/** How long a runner may take to answer a session's open before the gateway tries elsewhere. */
export const OPEN_TIMEOUT_MS = 5000;

/**
 * Gives up on a runner call that says nothing for `ms` (a paused process: its socket still
 * accepts, nothing answers): cancels it, and its error then reads as UNAVAILABLE, so the caller
 * reroutes as it would for a runner that is gone.
 */
export function answerWithin(call: { cancel(): void }, ms = OPEN_TIMEOUT_MS) {
  let answered = false;
  let silent = false;
  const timer = setTimeout(() => {
    if (answered) return;
    silent = true;
    call.cancel();
  }, ms);
  return {
    /** Whether the runner has said anything yet. */
    get answered(): boolean {
      return answered;
    },
    /** The runner said something: no timeout any more. */
    heard(): void {
      answered = true;
      clearTimeout(timer);
    },
    /** The error to act on: the call's own, or UNAVAILABLE when it was cut for silence. */
    error(err: unknown): unknown {
      clearTimeout(timer);
      return silent ? unavailable(`the session's runner did not answer within ${ms} ms; retry`) : err;
    },
  };
}
