// A session's turn lock: at most one agent run at a time. Plain data: the slot holds the run
// going (its turn and abort controller) and whether runs may start; it starts and calls nothing.
// The actor decides what runs and when (SessionActor.schedule): it takes the lock, runs, and
// releases it when the run has ended. Draining starts nothing new (a shutdown); stopping also
// aborts the run going (a close, a lost session).
import type { Queued } from "./mailbox.js";
import type { Resume } from "./session-rebuild.js";

/** What runs next: queued messages, or (with `resume`) a cut-off or waiting run to go on with. */
export interface NextRun {
  first: Queued[];
  resume?: Resume;
}

interface Run {
  readonly turnId: string;
  readonly controller: AbortController;
  done: Promise<void>;
}

export class RunSlot {
  private run?: Run;
  private draining = false;
  private stopping = false;

  /** The turn of the run going; undefined between runs. */
  get turnId(): string | undefined {
    return this.run?.turnId;
  }

  get busy(): boolean {
    return this.run !== undefined;
  }

  /** Stopped: no run will start again in this slot. */
  get stopped(): boolean {
    return this.stopping;
  }

  /** A run may start now: none is going, and the slot is neither draining nor stopped. */
  get open(): boolean {
    return !this.run && !this.stopping && !this.draining;
  }

  /** Takes the lock for run `turnId` (only when `open`); the signal returned aborts it. */
  take(turnId: string): AbortSignal {
    if (!this.open) throw new Error(`the turn lock is not open for run ${turnId}`);
    const controller = new AbortController();
    this.run = { turnId, controller, done: Promise.resolve() };
    return controller.signal;
  }

  /** The taken run's end, for drain and stop to wait on. */
  runs(done: Promise<void>): void {
    if (this.run) this.run.done = done;
  }

  /** Frees the lock: the run has ended. */
  release(): void {
    this.run = undefined;
  }

  /** Aborts the run going, if any, with `reason` as its signal's reason. */
  abort(reason: unknown): void {
    this.run?.controller.abort(reason);
  }

  /** Starts no new run from now on; resolves when the one going (if any) has ended. */
  drain(): Promise<void> {
    this.draining = true;
    return this.run?.done ?? Promise.resolve();
  }

  /** Starts nothing again and aborts the run going; resolves when it has ended. */
  stop(reason: unknown): Promise<void> {
    this.stopping = true;
    this.abort(reason);
    return this.run?.done ?? Promise.resolve();
  }

  /**
   * Calls `close` as if run `turnId` were going, so what it emits carries that turn and nothing
   * starts beside it: a rebuild closing a run the log shows as cut off.
   */
  asRun(turnId: string, close: () => void): void {
    const going = this.run;
    this.run = { turnId, controller: new AbortController(), done: Promise.resolve() };
    try {
      close();
    } finally {
      this.run = going;
    }
  }
}
