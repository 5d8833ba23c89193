// Protobuf varints for the hand-written encoders (runner/event-bytes.ts, sub-streams.ts): numbers,
// not bigints, so only non-negative safe integers.

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
