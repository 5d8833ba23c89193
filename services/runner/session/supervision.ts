// Supervision of one session's runs. A run that throws is a bug (model and tool failures end runs
// normally), and the state it leaves cannot be trusted, so the session's actor rebuilds itself
// from its log after a backoff, and other sessions are untouched. Too many failures within a
// minute mark the session failed: later frames are refused (recovery.ts RestartBudget).
import type { LogRecord } from "./session-log.js";
import type { CutOff } from "./recovery.js";
import { RestartBudget } from "./recovery.js";
import { StopReason } from "../../shared/gen/troupe/v1/session_pb.js";
import type { EventPayload, QueuedMessage } from "../loop/run.js";

/** What a restart uses of its actor. */
export interface RestartHost {
  sessionId: string;
  /** Frames past admission's wait for a restart; they land in the log before it is read. */
  admitting(): number;
  /** Every record of the session, pending appends flushed first. */
  readLog(): Promise<LogRecord[]>;
  /** Forgets what the actor holds and rebuilds it from `records`; the failed run is closed as `cutOff` says. */
  rebuild(records: LogRecord[], cutOff: CutOff): void;
  /** Publishes an event under the failed run's turn. */
  emit(payload: EventPayload): void;
  /** Tells subscribers that every queued message will not run, and forgets them. */
  dropQueued(message: string): void;
}

export class Supervision {
  private readonly budget = new RestartBudget();
  /** Set when the session gave up after too many failures: why. */
  failed?: string;
  /** Pending while a restart rebuilds state from the log; admissions wait for it. */
  restarting?: Promise<void>;

  constructor(private readonly host: RestartHost) {}

  /** After the run started by `startedBy` threw: backoff, then the actor rebuilt from its log. */
  async restart(startedBy: QueuedMessage[]): Promise<void> {
    const { host } = this;
    const { backoffMs, failed } = this.budget.spend(Date.now());
    host.emit({
      case: "error",
      value: {
        code: "INTERNAL",
        message: "the run failed unexpectedly; the session restarts from its log",
        retryable: true,
      },
    });
    let done!: () => void;
    this.restarting = new Promise((resolve) => (done = resolve));
    try {
      // New frames wait (Admission); the ones already past that point land in the log first, so
      // the read below holds every accepted frame and the queues rebuilt from it miss none.
      while (host.admitting() > 0) await new Promise((r) => setTimeout(r, 5));
      await new Promise((r) => setTimeout(r, backoffMs));
      const records = await host.readLog();
      // What was queued comes back from the log (accepted, never applied) and runs after this.
      host.rebuild(records, { reason: StopReason.ERROR, message: "the run failed unexpectedly", startedBy });
      if (failed) {
        this.failed = failed;
        host.dropQueued("dropped: the session failed");
        host.emit({
          case: "error",
          value: {
            code: "SESSION_FAILED",
            message: `session ${host.sessionId} has failed: ${failed}`,
            retryable: false,
          },
        });
      }
    } finally {
      this.restarting = undefined;
      done();
    }
  }
}
