// Supervision of one session's runs, as decisions. A run that throws is a bug (model and tool
// failures end runs normally), and the state it leaves cannot be trusted: the actor rebuilds
// itself from its log after a backoff (actor-hosts.ts restartFromLog carries it out), and other
// sessions are untouched. Too many failures within a minute fail the session: later frames are
// refused (recovery.ts RestartBudget). This part decides and keeps what admission must know.
import { RestartBudget } from "./recovery.js";

/** A restart to carry out: wait `backoffMs`, rebuild, then fail the session when `failed` says why. */
export interface Restart {
  backoffMs: number;
  failed?: string;
  /** The rebuild is over (done or not): frames stop waiting for it. */
  done(): void;
}

export class Supervision {
  private readonly budget = new RestartBudget();
  /** Set once the session gave up after too many failures: why. */
  failed?: string;
  /** Pending while a restart rebuilds state from the log; admissions wait for it. */
  restarting?: Promise<void>;

  /** A run threw at `nowMs`: the restart the actor carries out. Frames wait until its `done`. */
  begin(nowMs: number): Restart {
    const { backoffMs, failed } = this.budget.spend(nowMs);
    let done!: () => void;
    this.restarting = new Promise((resolve) => (done = resolve));
    return {
      backoffMs,
      failed,
      done: () => {
        this.restarting = undefined;
        done();
      },
    };
  }
}
