// A session is named by its owner and the id the owner gave it. Two principals (of one tenant or
// of two) may use the same session id without meeting: their sessions are different sessions, so
// a foreign session is simply one that does not exist for the caller (NOT_FOUND, never an oracle).
//
// Everything derived from client-supplied ids (file names, map keys, sandbox scope keys) goes
// through the two functions here, which are injective: distinct ids never share a name.
import { createHash } from "node:crypto";

export interface SessionRef {
  tenant: string;
  principal: string;
  sessionId: string;
}

/**
 * A map key for a session. Tenants and principals never contain "/" (auth.ts NAME) and session
 * ids never do (ids.ts), so the three parts split back uniquely.
 */
export const refKey = (r: SessionRef): string => `${r.tenant}/${r.principal}/${r.sessionId}`;

/** The session `sessionId` of an owner. */
export const refOf = (owner: { tenant: string; principal: string }, sessionId: string): SessionRef => ({
  tenant: owner.tenant,
  principal: owner.principal,
  sessionId,
});

export const sameRef = (a: SessionRef, b: SessionRef): boolean =>
  a.tenant === b.tenant && a.principal === b.principal && a.sessionId === b.sessionId;

/** Longest encoded part kept readable; a longer one is named by its hash (file names stop at 255 bytes). */
const READABLE_MAX = 120;

/**
 * One id as a file-name component: bytes of [A-Za-z0-9-] stay, every other UTF-8 byte becomes
 * `_` and two lowercase hex digits. Decoding is unambiguous, so the mapping is injective; it never
 * yields "", "." or "..", a "/" or a ".". A part longer than READABLE_MAX encoded becomes `_h` and
 * a SHA-256 of the raw value (`_h` is not an escape, so the two forms never meet); whoever stores
 * under such a name keeps the raw value beside it and compares it on read.
 */
export function filePart(id: string): string {
  let out = "";
  for (const byte of Buffer.from(id, "utf8")) {
    const c = String.fromCharCode(byte);
    out += /[A-Za-z0-9-]/.test(c) ? c : `_${byte.toString(16).padStart(2, "0")}`;
  }
  if (out === "") return "_";
  return out.length <= READABLE_MAX ? out : `_h${createHash("sha256").update(id).digest("hex")}`;
}

/** Several ids as one file name: their parts joined by "." (which no part contains). */
export const fileName = (...ids: string[]): string => ids.map(filePart).join(".");
