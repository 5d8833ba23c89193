// A session's writes to its log, and what a failed one means. Another runner having taken the
// session (SessionElsewhere, ABORTED) and a write that failed (a full disk: UNAVAILABLE) both lose
// the session here: the actor leaves memory, and the next call loads it from what the log holds.
// Going on in memory past a hole in the log would answer from state a reload cannot rebuild.
import { type RpcError, unavailable } from "../../shared/errors.js";
import { SessionElsewhere } from "./session-lease.js";
import type { LogRecord, SessionLog, SessionStore } from "./session-log.js";
import type { SessionRef } from "../../shared/session-ref.js";
import type { JournalLog } from "./event-journal.js";

export interface SessionWritesHooks {
  /** Loses the session with `err` (later calls are refused with it). Contract: never throws; a second loss is ignored. */
  lose(err: RpcError, why: string): void;
  /** The loss already suffered, if any. */
  lost(): RpcError | undefined;
}

/** The session's log as its event journal writes and reads it. */
export class SessionWrites implements JournalLog {
  constructor(
    private readonly log: SessionLog,
    private readonly ref: SessionRef,
    private readonly store: SessionStore,
    private readonly hooks: SessionWritesHooks,
  ) {}

  private get sessionId(): string {
    return this.ref.sessionId;
  }

  /** Every record of the session, as the store has it. May reject. */
  read(): Promise<LogRecord[]> {
    return this.store.read(this.ref);
  }

  /** Whether the log ends settled (settledLog) as it stands. */
  private settled = false;

  /** The log ends settled as it stands (a new session's, or one loaded so). */
  knownSettled(): void {
    this.settled = true;
  }

  /**
   * Says in the log that nothing is owed (a `settled` record), unless it already says so: the
   * orphan sweep of a runner that takes over leaves such a session until it is asked for.
   */
  settle(): void {
    if (this.settled) return;
    this.settled = true;
    void this.append({ t: "settled" }, false);
  }

  private note(record: LogRecord): void {
    if (record.t !== "seq" && record.t !== "settled") this.settled = false;
  }

  /** Appends for a caller that answers a client: a failure loses the session and rejects with the status to answer. */
  async appendOrRefuse(record: LogRecord, sync: boolean): Promise<void> {
    this.note(record);
    try {
      await this.log.append(record, sync);
    } catch (err) {
      throw this.failed(err);
    }
  }

  /** Appends what nobody waits on (a run's events, an elision): a failure loses the session; this resolves. */
  append(record: LogRecord, sync: boolean): Promise<void> {
    this.note(record);
    return this.log.append(record, sync).then(undefined, (err: unknown) => void this.failed(err));
  }

  private failed(err: unknown): RpcError {
    if (err instanceof SessionElsewhere) {
      this.hooks.lose(err, `session ${this.sessionId} was taken over by another runner; dropping it here`);
      return err;
    }
    const lost = unavailable(
      `session ${this.sessionId}'s log could not be written (${(err as Error).message ?? err}); retry: it is reloaded from its log on the next call`,
    );
    if (!this.hooks.lost()) {
      this.hooks.lose(lost, "session log append failed; the session leaves memory");
      void this.log.close().catch(() => undefined);
    }
    return this.hooks.lost() ?? lost;
  }
}
