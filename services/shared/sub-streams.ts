// AttachManyResponse on the wire, by hand: the runner writes one item per event of every session
// on the call, and the gateway reads them back, so neither builds a message object per event
// (the same reason as event-bytes.ts). A batch is items one after another: a repeated field's
// entries concatenate, so each item is a whole AttachManyResponse of one item, and a batch is
// their concatenation. The unit test checks the bytes against protobuf-es both ways.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { AttachManyResponseSchema, SubStreamStatusSchema, type SubStreamStatus } from "./gen/troupe/v1/runner_pb.js";
import { grpc } from "./rpc.js";
import { cursor, skipValue, varintAt, varintSize, writeVarint } from "./varint.js";

/**
 * A sub-stream's metadata (its open's, its status's trailers) travels as a string map: its text
 * entries. Binary (-bin) entries are left out; none of Troupe's own keys is one.
 */
export function metadataRecord(metadata: grpc.Metadata): Record<string, string> {
  const record: Record<string, string> = {};
  for (const [k, v] of Object.entries(metadata.getMap())) if (typeof v === "string") record[k] = v;
  return record;
}

/** The Metadata a sub-stream's string map stands for. */
export function metadataOf(record: Record<string, string>): grpc.Metadata {
  const metadata = new grpc.Metadata();
  for (const [k, v] of Object.entries(record)) metadata.set(k, v);
  return metadata;
}

const ITEMS = (1 << 3) | 2;
const ITEM_STREAM = 1 << 3;
const ITEM_RESPONSE = (2 << 3) | 2;
const ITEM_END = (3 << 3) | 2;

/**
 * The bytes before `length` bytes of response in an item for sub-stream `stream`: the item is
 * these followed by the response, so a writer gathering items copies the response only once.
 */
export function responseHead(stream: number, length: number): Buffer {
  // As protobuf-es writes it: proto3 leaves out a zero; a oneof's member is written even when empty.
  const streamLen = stream === 0 ? 0 : 1 + varintSize(stream);
  const inner = streamLen + 1 + varintSize(length) + length;
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner - length);
  let at = 0;
  out[at++] = ITEMS;
  at = writeVarint(out, at, inner);
  if (streamLen > 0) {
    out[at++] = ITEM_STREAM;
    at = writeVarint(out, at, stream);
  }
  out[at++] = ITEM_RESPONSE;
  writeVarint(out, at, length);
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

/**
 * Hands each item of an AttachManyResponse to `reader`, in order. The response bytes are views of
 * `batch`, not copies. Throws on bytes that are not such a message (the caller fails the call).
 */
export function readBatch(batch: Buffer, reader: BatchReader): void {
  const bad = (why: string) => new Error(`not an AttachManyResponse: ${why}`);
  let at = 0;
  while (at < batch.length) {
    const tag = varintAt(batch, at);
    if (tag < 0) throw bad("a tag runs past the end");
    if (tag !== ITEMS) {
      at = skipValue(batch, cursor, tag & 7, batch.length);
      if (at < 0) throw bad("a field runs past the end");
      continue;
    }
    const end = skipValue(batch, cursor, tag & 7, batch.length);
    if (end < 0) throw bad("an item runs past the end");
    let stream = 0;
    let response: Buffer | undefined;
    let status: SubStreamStatus | undefined;
    for (let p = cursor; p < end; ) {
      const t = varintAt(batch, p);
      if (t < 0) throw bad("a tag runs past its item");
      const next = t === ITEM_STREAM ? varintAt(batch, cursor) : skipValue(batch, cursor, t & 7, end);
      if (next < 0 || cursor > end) throw bad("a field runs past its item");
      if (t === ITEM_STREAM) {
        stream = next;
        p = cursor;
        continue;
      }
      // A length-delimited value's bytes are from cursor (its first byte) to next.
      if (t === ITEM_RESPONSE) (response = batch.subarray(cursor, next)), (status = undefined);
      else if (t === ITEM_END)
        (status = fromBinary(SubStreamStatusSchema, batch.subarray(cursor, next))), (response = undefined);
      p = next;
    }
    if (response) reader.response(stream, response);
    else if (status) reader.end(stream, status);
    at = end;
  }
}
