// Byte passthrough between a runner's Attach stream and a client's Chat or Subscribe stream: what
// the gateway must decode, how it leaves a runner's stream without a reset, and the one-byte change
// that turns an Attach event into a Subscribe event.
import { fromBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { SubscribeResponseSchema } from "../shared/gen/troupe/v1/gateway_pb.js";
import {
  AttachResponseSchema,
  type AttachRequestSchema,
  type AttachResponse,
} from "../shared/gen/troupe/v1/runner_pb.js";
import { AgentEventSchema } from "../shared/gen/troupe/v1/session_pb.js";
import type { grpc } from "../shared/rpc.js";
import type { Channel } from "../shared/rpc/channel.js";
import { RpcError, Status, unavailable } from "../shared/errors.js";
import { cursor, skipValue, varintAt } from "../shared/varint.js";

// The runner's AttachResponse and the client's ChatResponse have the same fields under the same
// numbers, so the runner's bytes are the client's bytes: the gateway forwards them without
// decoding and re-encoding every token. It decodes only what it acts on: the open answer and the
// events that delimit turns for tracing. A SubscribeResponse is an AgentEvent under another field
// number, so an Attach event becomes one by changing its tag byte.
const OPENED = AttachResponseSchema.field.opened.number;
const EVENT = AttachResponseSchema.field.event.number;
const AGENT_START = AgentEventSchema.field.agentStart.number;
const AGENT_END = AgentEventSchema.field.agentEnd.number;
const QUEUE_APPLIED = AgentEventSchema.field.queueApplied.number;

/**
 * Whether a runner response is one the gateway must look into; most are only forwarded. It runs
 * once per token, so it reads tags in place rather than through a BinaryReader, which allocated
 * per field (bench/passthrough: 56 ns a token event, against 1,199). It stops at the event: what
 * follows is not read. Anything before that it cannot read as plain wire data (a group, a cut
 * varint, a length past the end) answers true, so that fromBinary decides and reports it.
 */
export function needsDecoding(bytes: Uint8Array): boolean {
  const end = bytes.length;
  let pos = 0;
  while (pos < end) {
    const tag = varintAt(bytes, pos);
    if (tag < 0) return true;
    pos = cursor;
    const no = tag >>> 3;
    const wire = tag & 7;
    if (no === OPENED) return true;
    if (no === EVENT && wire === WireType.LengthDelimited) {
      const to = skipValue(bytes, pos, wire, end);
      return to < 0 || eventObserved(bytes, cursor, to);
    }
    pos = skipValue(bytes, pos, wire, end);
    if (pos < 0) return true;
  }
  return false;
}

/** Whether the AgentEvent in bytes[from, to) carries a payload the gateway observes. */
function eventObserved(bytes: Uint8Array, from: number, to: number): boolean {
  let pos = from;
  while (pos < to) {
    const tag = varintAt(bytes, pos);
    if (tag < 0) return true;
    const no = tag >>> 3;
    if (no === AGENT_START || no === AGENT_END || no === QUEUE_APPLIED) return true;
    pos = skipValue(bytes, cursor, tag & 7, to);
    if (pos < 0) return true;
  }
  return false;
}

/**
 * A runner's response, decoded; INTERNAL if it cannot be. It is read in a stream's data handler,
 * where a throw would escape into grpc-js and end the process, with every tenant's streams: the
 * caller ends that one stream with this error instead.
 */
export function decodeRunnerResponse(bytes: Uint8Array): AttachResponse {
  try {
    return fromBinary(AttachResponseSchema, bytes);
  } catch (err) {
    throw new RpcError(
      Status.INTERNAL,
      `the session's runner sent a response the gateway cannot read (${(err as Error).message})`,
    );
  }
}

export type AttachRequestInit = MessageInitShape<typeof AttachRequestSchema>;
/** A session stream to a runner, as a client stream (runner-mux.ts gives a sub-stream of AttachMany). */
export type RunnerCall = grpc.ClientDuplexStream<AttachRequestInit, Buffer>;

/** A runner's session stream being relayed into a client's stream (relayRunner). */
export interface RunnerRelay {
  readonly call: RunnerCall;
  /** The client's stream is over: leaves the runner's without a reset, unless it ended already. */
  leave(): void;
}

/**
 * Relays a runner's session stream into a client's: each response as `pass` makes it (undefined
 * drops it) goes to `out`, and the runner is paused while `out` is full. The runner's clean end
 * ends `out`; its failure fails `out`, unless it failed before saying anything and `reroute(err)`
 * takes it over (a session moved or a runner gone: the caller tries once where it is placed now).
 */
export function relayRunner(
  call: RunnerCall,
  out: Channel<Buffer>,
  pass: (bytes: Buffer) => Buffer | undefined,
  reroute: (err: unknown) => boolean,
): RunnerRelay {
  /** Whether the runner's stream ended by itself (its end or its error). */
  let ended = false;
  const answer = answerWithin(call);
  call.on("data", (bytes: Buffer) => {
    answer.heard();
    if (out.closed) return;
    const response = pass(bytes);
    if (response && !out.push(response)) {
      call.pause();
      out.room()?.then(() => call.resume());
    }
  });
  call.on("error", (error) => {
    ended = true;
    const err = answer.error(error);
    if (!answer.answered && !out.closed && reroute(err)) return;
    out.fail(err);
  });
  // grpc-js may end the readable side of a failed call too: only a clean end is one.
  call.on("end", () => {
    if (ended) return;
    ended = true;
    out.end();
  });
  return { call, leave: () => ended || leaveRunnerCall(call) };
}

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
