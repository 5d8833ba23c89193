// Learning after runs waits while the runner is busy. Each completed run asks the memory service
// to learn from it, which costs a model call, embeddings and a write, all on the machine that is
// streaming other sessions' replies. Fired at once, 200 runs ending together started 200 of them
// during the next round's streaming (bench/stream, bench/history.md). So jobs queue here: a few
// run at a time while the runner's event loop is mostly idle; while it is busy, one starts only
// after a pause with none running, so learning slows down under load but never stops for good.
// Learning is best effort: past `maxWaiting` the oldest waiting job is dropped, and said so.
import { performance } from "node:perf_hooks";
import type { Logger } from "../../shared/process/log.js";

export interface LearningQueueOptions {
  /** Jobs running at once while the runner is not busy. */
  concurrency?: number;
  /** Event-loop utilisation (0..1) above which the runner counts as busy. */
  busyAbove?: number;
  /** While busy: the pause, with no job running, after which one more starts. */
  trickleMs?: number;
  /** Jobs waiting at most; past it the oldest is dropped. */
  maxWaiting?: number;
  /** How often the load is sampled while jobs wait. */
  sampleMs?: number;
  /** How busy the runner is now, 0..1. Contract: cheap, never throws. Default: event-loop utilisation over the last sample. */
  load?: () => number;
}

export const LEARNING_DEFAULTS = {
  concurrency: 2,
  busyAbove: 0.5,
  trickleMs: 2000,
  maxWaiting: 1000,
  sampleMs: 250,
} as const;

type Job = () => Promise<unknown>;

export class LearningQueue {
  private readonly waitingJobs: Job[] = [];
  private active = 0;
  private droppedJobs = 0;
  private lastStartMs = 0;
  private timer?: NodeJS.Timeout;
  private closed = false;
  private readonly options: Required<Omit<LearningQueueOptions, "load">>;
  private readonly load: () => number;

  constructor(
    private readonly logger: Logger,
    options: LearningQueueOptions = {},
  ) {
    this.options = { ...LEARNING_DEFAULTS, ...options };
    this.load = options.load ?? eventLoopLoad(this.options.sampleMs);
  }

  /** Queues a job; it runs when the runner has room for it. Contract: never throws; a failing job is the job's to report. */
  add(job: Job): void {
    if (this.closed) return;
    this.waitingJobs.push(job);
    if (this.waitingJobs.length > this.options.maxWaiting) {
      this.waitingJobs.shift();
      this.droppedJobs++;
      // The first and every hundredth: a long overload must not become a flood of lines.
      if (this.droppedJobs % 100 === 1)
        this.logger.warn("learning is behind: the oldest waiting turns are not learned from", {
          waiting: this.waitingJobs.length,
          dropped: this.droppedJobs,
        });
    }
    this.pump();
  }

  get waiting(): number {
    return this.waitingJobs.length;
  }

  get running(): number {
    return this.active;
  }

  get dropped(): number {
    return this.droppedJobs;
  }

  /** Stops: waiting jobs are dropped (their number is returned), running ones finish on their own. */
  close(): number {
    const left = this.waitingJobs.length;
    this.closed = true;
    this.waitingJobs.length = 0;
    clearInterval(this.timer);
    this.timer = undefined;
    return left;
  }

  private pump(): void {
    while (this.waitingJobs.length > 0 && this.active < this.options.concurrency) {
      const busy = this.load() > this.options.busyAbove;
      if (busy && (this.active > 0 || Date.now() - this.lastStartMs < this.options.trickleMs)) break;
      this.start(this.waitingJobs.shift() as Job);
    }
    // While jobs wait, look again now and then: the load changes without anything calling here.
    if (this.waitingJobs.length > 0 && !this.timer && !this.closed) {
      this.timer = setInterval(() => this.pump(), this.options.sampleMs);
      this.timer.unref();
    } else if (this.waitingJobs.length === 0 && this.timer) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  private start(job: Job): void {
    this.active++;
    this.lastStartMs = Date.now();
    const finished = () => {
      this.active--;
      if (!this.closed) this.pump();
    };
    let running: Promise<unknown>;
    try {
      running = job();
    } catch {
      running = Promise.resolve();
    }
    running.then(finished, finished);
  }
}

/** The event loop's utilisation over the last window of at least `windowMs` (0 until one has passed). */
function eventLoopLoad(windowMs: number): () => number {
  let last = performance.eventLoopUtilization();
  let lastAt = performance.now();
  let value = 0;
  return () => {
    if (performance.now() - lastAt >= windowMs) {
      const now = performance.eventLoopUtilization();
      value = performance.eventLoopUtilization(now, last).utilization;
      last = now;
      lastAt = performance.now();
    }
    return value;
  };
}
