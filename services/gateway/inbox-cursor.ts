// The SubscribeInbox cursor: where a client's inbox stands across many sessions, in a string the
// client keeps. It says "every event with a time before `watermarkMs` has been handed over, and
// for the sessions listed, every event up to their seq". A session drops out of the list once its
// last event is older than the watermark, so the cursor's size follows the sessions active in the
// last minute, not every session ever made. Events' times are their runners' clocks: the
// watermark lags the newest event by a minute, so runners' clocks may disagree by that much.
import { invalidArgument } from "../shared/errors.js";
import { isSessionId } from "../shared/ids.js";

export interface InboxCursor {
  watermarkMs: number;
  /** session id -> the last seq handed over. */
  seqs: Map<string, number>;
}

const PREFIX = "i1.";
const MAX_ENTRIES = 100_000;

export function encodeCursor(cursor: InboxCursor): string {
  const body = JSON.stringify({ w: cursor.watermarkMs, s: [...cursor.seqs] });
  return PREFIX + Buffer.from(body).toString("base64url");
}

/** The cursor in a request; empty is the start of everything. Anything not issued here is INVALID_ARGUMENT. */
export function decodeCursor(text: string): InboxCursor {
  if (text === "") return { watermarkMs: 0, seqs: new Map() };
  const bad = () => invalidArgument("after_cursor is not a cursor this service issued");
  if (!text.startsWith(PREFIX) || !/^[A-Za-z0-9_-]*$/.test(text.slice(PREFIX.length))) throw bad();
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(text.slice(PREFIX.length), "base64url").toString("utf8"));
  } catch {
    throw bad();
  }
  const { w, s } = (parsed ?? {}) as { w?: unknown; s?: unknown };
  if (!Number.isSafeInteger(w) || (w as number) < 0 || !Array.isArray(s) || s.length > MAX_ENTRIES) throw bad();
  const seqs = new Map<string, number>();
  for (const entry of s) {
    if (!Array.isArray(entry) || entry.length !== 2) throw bad();
    const [id, seq] = entry as unknown[];
    if (typeof id !== "string" || !isSessionId(id) || !Number.isSafeInteger(seq) || (seq as number) < 0) throw bad();
    seqs.set(id, seq as number);
  }
  return { watermarkMs: w as number, seqs };
}
