// Signed requests, the scheme Slack uses for its Events API
// (https://api.slack.com/authentication/verifying-requests-from-slack) and the generic webhook
// uses both ways (docs/channels.md): HMAC-SHA256 under a shared secret of
// "<version>:<unix seconds>:<raw body>", sent as `<signature header>: <version>=<hex>` with the
// seconds in a timestamp header. A signature more than five minutes from now is refused, so a
// captured request cannot be replayed later.
import { createHmac, timingSafeEqual } from "node:crypto";

export interface SignatureScheme {
  version: string;
  signatureHeader: string;
  timestampHeader: string;
}

/** The generic webhook's: `X-Troupe-Signature: v1=...`, `X-Troupe-Timestamp`. */
export const TROUPE_SIGNATURE: SignatureScheme = {
  version: "v1",
  signatureHeader: "x-troupe-signature",
  timestampHeader: "x-troupe-timestamp",
};

/** Slack's: `X-Slack-Signature: v0=...`, `X-Slack-Request-Timestamp`. */
export const SLACK_SIGNATURE: SignatureScheme = {
  version: "v0",
  signatureHeader: "x-slack-signature",
  timestampHeader: "x-slack-request-timestamp",
};

const TOLERANCE_S = 300;

export function signature(scheme: SignatureScheme, secret: string, timestampS: number, body: string | Buffer): string {
  const mac = createHmac("sha256", secret);
  mac.update(`${scheme.version}:${timestampS}:`);
  mac.update(body);
  return `${scheme.version}=${mac.digest("hex")}`;
}

/** The headers that sign `body` now, in the generic webhook's scheme. */
export function signedHeaders(secret: string, body: string): Record<string, string> {
  const ts = Math.floor(Date.now() / 1000);
  return {
    [TROUPE_SIGNATURE.timestampHeader]: String(ts),
    [TROUPE_SIGNATURE.signatureHeader]: signature(TROUPE_SIGNATURE, secret, ts, body),
  };
}

/** Why a request's signature is not good, or undefined when it is. */
export function signatureProblem(
  scheme: SignatureScheme,
  secret: string,
  headers: Record<string, string | string[] | undefined>,
  body: Buffer,
  nowS = Date.now() / 1000,
): string | undefined {
  const { timestampHeader, signatureHeader } = scheme;
  const ts = headers[timestampHeader];
  const sig = headers[signatureHeader];
  if (typeof ts !== "string" || !/^\d{1,12}$/.test(ts)) return `${timestampHeader} is missing or not unix seconds`;
  if (Math.abs(nowS - Number(ts)) > TOLERANCE_S) return `${timestampHeader} is more than ${TOLERANCE_S} s from now`;
  if (typeof sig !== "string") return `${signatureHeader} is missing`;
  return equalSecrets(sig, signature(scheme, secret, Number(ts), body))
    ? undefined
    : `${signatureHeader} does not match the body`;
}

/** Whether two secrets (or signatures) are the same, in time that does not tell where they differ. */
export function equalSecrets(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}
