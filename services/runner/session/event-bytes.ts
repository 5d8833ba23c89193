// The Attach stream's bytes for an event. A session's most frequent event is a token delta, one
// per token at a real model's pace, and encoding it through protobuf-es (a new writer, its buffer
// grown chunk by chunk, every field checked against the schema) took about a tenth of the runner's
// CPU in the paced benchmark (bench/history.md, bench/stream). A text or thinking delta is
// written here by hand, field by field as protobuf-es writes it (the unit test compares the bytes);
// every other event goes through protobuf-es.
import { create, toBinary } from "@bufbuild/protobuf";
import { AttachResponseSchema } from "../../shared/gen/troupe/v1/runner_pb.js";
import type { AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { varintSize, writeVarint } from "../../shared/varint.js";

// Tags: (field number << 3) | wire type, wire type 0 for varints and 2 for length-delimited.
const ATTACH_EVENT = (2 << 3) | 2;
const EVENT_SESSION_ID = (1 << 3) | 2;
const EVENT_SEQ = 2 << 3;
const EVENT_TURN_ID = (3 << 3) | 2;
const EVENT_TIME = (4 << 3) | 2;
const EVENT_MESSAGE_UPDATE = (15 << 3) | 2;
const TIME_SECONDS = 1 << 3;
const TIME_NANOS = 2 << 3;
const UPDATE_MESSAGE_ID = (1 << 3) | 2;
const UPDATE_TEXT = (2 << 3) | 2;
const UPDATE_THINKING = (3 << 3) | 2;

/** The largest seq written by hand: the varint writer works on numbers, not bigints. */
const MAX_SEQ = BigInt(Number.MAX_SAFE_INTEGER);

/** The AttachResponse carrying `event`, encoded. */
export function attachEventBytes(event: AgentEvent): Uint8Array {
  const { payload: p, time } = event;
  const seconds = time ? Number(time.seconds) : -1;
  if (
    p.case === "messageUpdate" &&
    (p.value.delta.case === "text" || p.value.delta.case === "thinking") &&
    time &&
    seconds >= 0 &&
    Number.isSafeInteger(seconds) &&
    time.nanos >= 0 &&
    event.seq <= MAX_SEQ
  )
    return deltaBytes(event, p.value.messageId, p.value.delta.case, p.value.delta.value, seconds, time.nanos);
  return toBinary(AttachResponseSchema, create(AttachResponseSchema, { kind: { case: "event", value: event } }));
}

function deltaBytes(
  event: AgentEvent,
  messageId: string,
  kind: "text" | "thinking",
  text: string,
  seconds: number,
  nanos: number,
): Uint8Array {
  const seq = Number(event.seq);
  const sessionLen = Buffer.byteLength(event.sessionId);
  const turnLen = Buffer.byteLength(event.turnId);
  const idLen = Buffer.byteLength(messageId);
  const textLen = Buffer.byteLength(text);
  const timeLen = (seconds > 0 ? 1 + varintSize(seconds) : 0) + (nanos > 0 ? 1 + varintSize(nanos) : 0);
  const updateLen = (idLen > 0 ? 1 + varintSize(idLen) + idLen : 0) + 1 + varintSize(textLen) + textLen;
  const eventLen =
    (sessionLen > 0 ? 1 + varintSize(sessionLen) + sessionLen : 0) +
    (seq > 0 ? 1 + varintSize(seq) : 0) +
    (turnLen > 0 ? 1 + varintSize(turnLen) + turnLen : 0) +
    1 +
    varintSize(timeLen) +
    timeLen +
    1 +
    varintSize(updateLen) +
    updateLen;
  const out = Buffer.allocUnsafe(1 + varintSize(eventLen) + eventLen);
  let at = 0;
  out[at++] = ATTACH_EVENT;
  at = writeVarint(out, at, eventLen);
  if (sessionLen > 0) at = writeString(out, at, EVENT_SESSION_ID, event.sessionId, sessionLen);
  if (seq > 0) {
    out[at++] = EVENT_SEQ;
    at = writeVarint(out, at, seq);
  }
  if (turnLen > 0) at = writeString(out, at, EVENT_TURN_ID, event.turnId, turnLen);
  out[at++] = EVENT_TIME;
  at = writeVarint(out, at, timeLen);
  if (seconds > 0) {
    out[at++] = TIME_SECONDS;
    at = writeVarint(out, at, seconds);
  }
  if (nanos > 0) {
    out[at++] = TIME_NANOS;
    at = writeVarint(out, at, nanos);
  }
  out[at++] = EVENT_MESSAGE_UPDATE;
  at = writeVarint(out, at, updateLen);
  if (idLen > 0) at = writeString(out, at, UPDATE_MESSAGE_ID, messageId, idLen);
  at = writeString(out, at, kind === "text" ? UPDATE_TEXT : UPDATE_THINKING, text, textLen);
  return out;
}

function writeString(out: Buffer, at: number, tag: number, value: string, byteLength: number): number {
  out[at++] = tag;
  at = writeVarint(out, at, byteLength);
  return at + out.write(value, at, byteLength, "utf8");
}
