// AttachManyResponse on the wire, by hand: the runner writes one item per event of every session
// on the call, and the gateway reads them back, so neither builds a message object per event
// (the same reason as event-bytes.ts). A batch is items one after another: a repeated field's
// entries concatenate, so each item is a whole AttachManyResponse of one item, and a batch is
// their concatenation. The unit test checks the bytes against protobuf-es both ways.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { AttachManyResponseSchema, SubStreamStatusSchema, type SubStreamStatus } from "./gen/troupe/v1/runner_pb.js";
import { varintSize, writeVarint } from "./varint.js";

const ITEMS = (1 << 3) | 2;
const ITEM_STREAM = 1 << 3;
const ITEM_RESPONSE = (2 << 3) | 2;
const ITEM_END = (3 << 3) | 2;

/** One item carrying `response` (an encoded AttachResponse) for sub-stream `stream`. */
export function responseItem(stream: number, response: Uint8Array): Buffer {
  // As protobuf-es writes it: proto3 leaves out a zero; a oneof's member is written even when empty.
  const streamLen = stream === 0 ? 0 : 1 + varintSize(stream);
  const inner = streamLen + 1 + varintSize(response.length) + response.length;
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = ITEMS;
  at = writeVarint(out, at, inner);
  if (streamLen > 0) {
    out[at++] = ITEM_STREAM;
    at = writeVarint(out, at, stream);
  }
  out[at++] = ITEM_RESPONSE;
  at = writeVarint(out, at, response.length);
  out.set(response, at);
  return out;
}

/** One item ending sub-stream `stream` with a status (code 0: a clean end). Rare: protobuf-es. */
export function endItem(stream: number, code: number, details: string, trailers: Record<string, string> = {}): Buffer {
  const msg = create(AttachManyResponseSchema, {
    items: [{ stream, kind: { case: "end", value: { code, details, trailers } } }],
  });
  return Buffer.from(toBinary(AttachManyResponseSchema, msg));
}

export interface BatchReader {
  response(stream: number, bytes: Buffer): void;
  end(stream: number, status: SubStreamStatus): void;
}

function readVarint(buf: Buffer, at: number): [number, number] {
  let n = 0;
  let scale = 1;
  for (;;) {
    if (at >= buf.length) throw new Error("a varint runs past the end of the message");
    const b = buf[at++];
    n += (b & 0x7f) * scale;
    if (b < 0x80) return [n, at];
    scale *= 128;
    if (scale > 2 ** 63) throw new Error("a varint longer than 10 bytes");
  }
}

/** Skips a field of wire type `wire` at `at`; returns where the next field starts. */
function skip(buf: Buffer, at: number, wire: number): number {
  switch (wire) {
    case 0:
      return readVarint(buf, at)[1];
    case 1:
      return at + 8;
    case 2: {
      const [len, start] = readVarint(buf, at);
      return start + len;
    }
    case 5:
      return at + 4;
    default:
      throw new Error(`wire type ${wire} is not one proto3 writes`);
  }
}

/**
 * Hands each item of an AttachManyResponse to `reader`, in order. The response bytes are views of
 * `batch`, not copies. Throws on bytes that are not such a message (the caller fails the call).
 */
export function readBatch(batch: Buffer, reader: BatchReader): void {
  let at = 0;
  while (at < batch.length) {
    const [tag, afterTag] = readVarint(batch, at);
    if (tag !== ITEMS) {
      at = skip(batch, afterTag, tag & 7);
      continue;
    }
    const [len, start] = readVarint(batch, afterTag);
    const end = start + len;
    if (end > batch.length) throw new Error("an item runs past the end of the message");
    let stream = 0;
    let response: Buffer | undefined;
    let status: SubStreamStatus | undefined;
    for (let p = start; p < end; ) {
      const [t, q] = readVarint(batch, p);
      if (t === ITEM_STREAM) [stream, p] = readVarint(batch, q);
      else if (t === ITEM_RESPONSE || t === ITEM_END) {
        const [l, s] = readVarint(batch, q);
        if (s + l > end) throw new Error("a field runs past the end of its item");
        if (t === ITEM_RESPONSE) (response = batch.subarray(s, s + l)), (status = undefined);
        else (status = fromBinary(SubStreamStatusSchema, batch.subarray(s, s + l))), (response = undefined);
        p = s + l;
      } else p = skip(batch, q, t & 7);
      if (p > end) throw new Error("a field runs past the end of its item");
    }
    if (response) reader.response(stream, response);
    else if (status) reader.end(stream, status);
    at = end;
  }
}
