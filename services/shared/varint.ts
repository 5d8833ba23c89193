// Protobuf varints and fields by hand, for the hot paths that skip protobuf-es: the encoders
// (runner/session/event-bytes.ts, sub-streams.ts) and the gateway's scans. Numbers, not bigints.
import { WireType } from "@bufbuild/protobuf/wire";

/** Bytes of `n` (a non-negative safe integer) as a varint. */
export function varintSize(n: number): number {
  let size = 1;
  while (n >= 128) {
    n = Math.floor(n / 128);
    size++;
  }
  return size;
}

/** Writes `n` as a varint at `at`; returns where the next byte goes. */
export function writeVarint(out: Uint8Array, at: number, n: number): number {
  while (n >= 128) {
    out[at++] = (n % 128) | 128;
    n = Math.floor(n / 128);
  }
  out[at++] = n;
  return at;
}

// Reading, in place, for the gateway's scans of runner responses (passthrough.ts, sub-streams.ts).
// Where varintAt stopped reading: a module variable (read by importers as a live binding) so that
// no call allocates.
export let cursor = 0;

/**
 * The varint at pos, up to 2^32 - 1 (a tag or a length), with `cursor` set past it; -1 for one
 * that is cut short or larger.
 */
export function varintAt(bytes: Uint8Array, pos: number): number {
  let value = 0;
  for (let shift = 0; shift < 31 && pos < bytes.length; shift += 7) {
    const b = bytes[pos++]!;
    value |= (b & 0x7f) << shift;
    if (b < 0x80) {
      cursor = pos;
      return shift < 28 || b < 0x10 ? value >>> 0 : -1;
    }
  }
  return -1;
}

/**
 * The position after a value of this wire type starting at pos; -1 if it does not fit before end.
 * For a length-delimited value, `cursor` is left at its first byte.
 */
export function skipValue(bytes: Uint8Array, pos: number, wire: number, end: number): number {
  switch (wire) {
    case WireType.Varint:
      for (let i = 0; i < 10 && pos < end; i++) if (bytes[pos++]! < 0x80) return pos;
      return -1;
    case WireType.Bit64:
      return pos + 8 <= end ? pos + 8 : -1;
    case WireType.Bit32:
      return pos + 4 <= end ? pos + 4 : -1;
    case WireType.LengthDelimited: {
      const len = varintAt(bytes, pos);
      return len >= 0 && cursor + len <= end ? cursor + len : -1;
    }
    default:
      return -1;
  }
}
