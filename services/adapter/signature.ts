// Signatures of the generic webhook, both ways (docs/channels.md): HMAC-SHA256 under the shared
// secret of "v1:<unix seconds>:<raw body>", sent as `X-Troupe-Signature: v1=<hex>` with the
// seconds in `X-Troupe-Timestamp`. A signature more than five minutes from now is refused, so a
// captured request cannot be replayed later.
import { createHmac, timingSafeEqual } from "node:crypto";

export const SIGNATURE_HEADER = "x-troupe-signature";
export const TIMESTAMP_HEADER = "x-troupe-timestamp";
const TOLERANCE_S = 300;

export function signature(secret: string, timestampS: number, body: string | Buffer): string {
  const mac = createHmac("sha256", secret);
  mac.update(`v1:${timestampS}:`);
  mac.update(body);
  return `v1=${mac.digest("hex")}`;
}

/** The headers that sign `body` now. */
export function signedHeaders(secret: string, body: string): Record<string, string> {
  const ts = Math.floor(Date.now() / 1000);
  return { [TIMESTAMP_HEADER]: String(ts), [SIGNATURE_HEADER]: signature(secret, ts, body) };
}

/** Why a request's signature is not good, or undefined when it is. */
export function signatureProblem(
  secret: string,
  headers: Record<string, string | string[] | undefined>,
  body: Buffer,
  nowS = Date.now() / 1000,
): string | undefined {
  const ts = headers[TIMESTAMP_HEADER];
  const sig = headers[SIGNATURE_HEADER];
  if (typeof ts !== "string" || !/^\d{1,12}$/.test(ts)) return `${TIMESTAMP_HEADER} is missing or not unix seconds`;
  if (Math.abs(nowS - Number(ts)) > TOLERANCE_S) return `${TIMESTAMP_HEADER} is more than ${TOLERANCE_S} s from now`;
  if (typeof sig !== "string") return `${SIGNATURE_HEADER} is missing`;
  const want = Buffer.from(signature(secret, Number(ts), body));
  const got = Buffer.from(sig);
  if (got.length !== want.length || !timingSafeEqual(got, want)) return `${SIGNATURE_HEADER} does not match the body`;
  return undefined;
}
