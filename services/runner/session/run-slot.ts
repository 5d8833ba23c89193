// A session's turn lock: at most one agent run at a time. When work arrives or a run ends, the
// slot asks its session what runs next and starts it. Draining starts nothing new (a shutdown);
// stopping also aborts the run going (a close, a lost session). The slot knows nothing of what
// a run does: the session binds that in its hooks.
import { newId } from "../../shared/ids.js";
import type { Queued } from "./mailbox.js";
import type { Resume } from "./session-rebuild.js";

/** What runs next: queued messages, or (with `resume`) a cut-off run to go on with. */
export interface NextRun {
  first: Queued[];
  resume?: Resume;
}

/** What the slot asks of its session. */
export interface RunSlotHooks {
  /** Takes what runs next off the session's queue; undefined: nothing is owed. Contract: never throws. */
  takeNext(): NextRun | undefined;
  /** Runs one run to its end. Contract: never rejects (a failure is the session's to handle). */
  execute(next: NextRun, signal: AbortSignal): Promise<void>;
  /** A run has started; `turnId` is already current. */
  started(): void;
  /** A run has ended and the slot is free; the next run is chosen right after. */
  ended(): void;
  /** Nothing was owed when the slot looked: the session may be idle. */
  nothingOwed(): void;
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

  constructor(private readonly hooks: RunSlotHooks) {}

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

  /** Starts the next run unless one is going or the slot is draining or stopped. */
  schedule(): void {
    if (this.run || this.stopping || this.draining) return;
    const next = this.hooks.takeNext();
    if (!next) {
      this.hooks.nothingOwed();
      return;
    }
    const controller = new AbortController();
    const run: Run = { turnId: next.resume?.turnId ?? newId(), controller, done: Promise.resolve() };
    this.run = run;
    this.hooks.started();
    run.done = this.hooks.execute(next, controller.signal).finally(() => {
      this.run = undefined;
      this.hooks.ended();
      this.schedule();
    });
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
