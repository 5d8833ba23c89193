// What a runner's earlier process left half done. A session that process still held when it was
// killed may have a run cut off in the middle, or a prompt accepted and not yet run. Loading the
// session resumes that work (run_resumed; docs/architecture.md, the session actor), but a load
// used to wait for the session's next use. That can be much later: a schedule's turn, a message
// sent with SendMessage whose client has gone, an HTTP client that gave up. So at start the
// runner loads every session its earlier process left, a few at a time, in the background.
import type { SessionRef } from "../shared/session-ref.js";
import type { Logger } from "../shared/log.js";
import type { SessionStore } from "./session-log.js";

export interface LeftRunsDeps {
  store: SessionStore;
  /** Whether the session belongs on this runner now (its placement); false: its next use elsewhere resumes it. */
  placedHere(ref: SessionRef): Promise<boolean>;
  /** Loads the session's actor, which goes on with what its log shows owed. */
  load(ref: SessionRef): Promise<unknown>;
  logger: Logger;
  /** Loads at a time (default 4): a restart should not be slowed by a stampede of its own. */
  concurrency?: number;
}

/** Loads what was left; resolves with how many sessions were found and loaded. Contract: never throws. */
export function resumeLeftRuns(deps: LeftRunsDeps): { done: Promise<{ found: number; loaded: number }>; stop(): void } {
  let stopped = false;
  const done = (async () => {
    const left = await deps.store.leftHere().catch((err: unknown) => {
      deps.logger.warn("cannot list the sessions an earlier process of this runner left", { error: String(err) });
      return [] as SessionRef[];
    });
    let loaded = 0;
    let next = 0;
    const worker = async () => {
      while (!stopped && next < left.length) {
        const ref = left[next++];
        try {
          if (!(await deps.placedHere(ref))) continue;
          await deps.load(ref);
          loaded++;
        } catch (err) {
          // Taken by another runner meanwhile, or deleted: its own next use decides.
          deps.logger.debug("a session left by an earlier process was not loaded", {
            session: ref.sessionId,
            error: String((err as Error).message ?? err),
          });
        }
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, deps.concurrency ?? 4) }, worker));
    if (left.length > 0)
      deps.logger.info("loaded the sessions an earlier process of this runner left, resuming what they owed", {
        found: left.length,
        loaded,
      });
    return { found: left.length, loaded };
  })();
  return {
    done,
    stop: () => {
      stopped = true;
    },
  };
}
