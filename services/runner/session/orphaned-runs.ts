// Work a runner process left half done when it died. A session it still held may have a run cut
// off in the middle, or a prompt accepted and not yet run. Loading the session resumes that work
// (run_resumed; docs/architecture.md, the session actor), but a load used to wait for the
// session's next use. That can be much later: a schedule's turn, a message sent with SendMessage
// whose client has gone, an HTTP client that gave up. So each runner sweeps for sessions whose
// holder is gone (SessionStore.orphans) at start and then every `everyMs`, and loads those placed
// on it, a few at a time. Placement divides a dead runner's sessions among the live ones; two
// runners loading one session is refused by its lease, as any second activation is.
import type { SessionRef } from "../../shared/session-ref.js";
import type { Logger } from "../../shared/process/log.js";
import type { SessionStore } from "./session-log.js";

export interface OrphanedRunsDeps {
  store: SessionStore;
  /** Whether the session belongs on this runner now (its placement). */
  placedHere(ref: SessionRef): Promise<boolean>;
  /** Loads the session's actor, which goes on with what its log shows owed. */
  load(ref: SessionRef): Promise<unknown>;
  logger: Logger;
  /** Time between sweeps after the first (at start). */
  everyMs: number;
  /** Loads at a time (default 4): a restart should not be slowed by a stampede of its own. */
  concurrency?: number;
}

/** Sweeps until stopped. Contract: never throws. */
export function adoptOrphans(deps: OrphanedRunsDeps): { stop(): void } {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;

  const sweep = async (): Promise<void> => {
    const orphans = await deps.store.orphans().catch((err: unknown) => {
      deps.logger.warn("cannot list the sessions whose runner process is gone", { error: String(err) });
      return [] as SessionRef[];
    });
    let loaded = 0;
    let next = 0;
    const worker = async () => {
      while (!stopped && next < orphans.length) {
        const ref = orphans[next++];
        try {
          if (!(await deps.placedHere(ref))) continue;
          await deps.load(ref);
          loaded++;
        } catch (err) {
          // Taken by another runner meanwhile, or deleted: its own next use decides.
          deps.logger.debug("a session whose runner process is gone was not loaded", {
            session: ref.sessionId,
            error: String((err as Error).message ?? err),
          });
        }
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, deps.concurrency ?? 4) }, worker));
    if (loaded > 0)
      deps.logger.info("loaded sessions whose runner process is gone, resuming what they owed", {
        found: orphans.length,
        loaded,
      });
  };

  const loop = async () => {
    await sweep();
    if (!stopped) {
      timer = setTimeout(loop, deps.everyMs);
      timer.unref();
    }
  };
  void loop();
  return {
    stop: () => {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
