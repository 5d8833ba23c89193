// When a session's event stream that broke is worth opening again, and when. A runner that dies
// mid-run is restarted (troupe up) or replaced (another runner takes its sessions) and the run
// goes on there (run_resumed), so its clients reopen after the last seq they saw instead of
// failing: troupe chat (services/cli/chat-stream.ts) and the OpenAI endpoint
// (services/gateway/http/run-events.ts) follow the same rule.
import { Status } from "./errors.js";

/** How long, in all, a broken stream is tried again before its client gives up. */
export const RESUME_FOR_MS = 60_000;

const RESUMABLE = new Set<number>([Status.UNAVAILABLE, Status.ABORTED]);

/** True for the errors a reopen can cure: the runner is gone (UNAVAILABLE) or the session moved (ABORTED). */
export function resumable(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === "number" && RESUMABLE.has(code);
}

/** The wait before the next attempt, `lostMs` after the stream first broke: quick at first (a restart takes a second or two), then every 2 s. */
export function resumeDelayMs(lostMs: number): number {
  return Math.min(2000, 250 + lostMs / 2);
}
