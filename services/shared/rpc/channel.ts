// A queue read as an async iterable: producers push synchronously (a session's events, a runner's
// bytes, a client's frames), one consumer pulls. It is how a stream handler hands its responses to
// the server when they come from callbacks rather than from a loop of its own.
//
// Contract:
// - push() queues an item and says whether the queue is still under its mark; past the mark a
//   producer that can wait awaits room() (resolves once the consumer took the queue below it);
// - end() ends the iteration after what is queued (with end(err), the iteration then throws err);
//   fail(err) ends it at once with err, dropping what is queued, even after end(); each counts
//   once, and a push after either is dropped;
// - the consumer leaving (a `for await` that breaks, or return()) ends it too: what is queued is
//   dropped and the producer's room() waiters are released.

/** Items a channel holds before push() reports it full, unless told otherwise. */
export const CHANNEL_MARK = 64;
/** A mark for a channel of bytes, weighed by their length: what one Node stream buffers. */
export const BYTES_MARK = 64 * 1024;

/** How much an item of bytes weighs: its length. */
export const byteLength = (item: Uint8Array | object): number => (item instanceof Uint8Array ? item.length : 64);

type Waiter<T> = { resolve(r: IteratorResult<T>): void; reject(err: unknown): void };

export class Channel<T> implements AsyncIterableIterator<T> {
  private items: (T | undefined)[] = [];
  private head = 0;
  /** What the queued items weigh (their count, unless a weigh function was given). */
  private weight = 0;
  private reader?: Waiter<T>;
  private roomWaiters: (() => void)[] = [];
  private over = false;
  private failure: { err: unknown } | undefined;
  private afterQueue: { err: unknown } | undefined;
  private failed = false;

  /**
   * `mark`: the weight at which push() reports the channel full; `weigh`: an item's weight (1 by
   * default, so the mark counts items; byteLength makes it count bytes, as a stream's buffer does).
   */
  constructor(
    private readonly mark = CHANNEL_MARK,
    private readonly weigh: (item: T) => number = () => 1,
  ) {}

  /** Items queued and not yet taken. */
  get size(): number {
    return this.items.length - this.head;
  }

  /** Whether it ended (end, fail or the consumer left): pushes are dropped. */
  get closed(): boolean {
    return this.over;
  }

  /** Queues `item`; false once what is queued weighs its mark (await room() before the next, if you can wait). */
  push(item: T): boolean {
    if (this.over) return true;
    const reader = this.reader;
    if (reader) {
      this.reader = undefined;
      reader.resolve({ value: item, done: false });
      return true;
    }
    this.items.push(item);
    this.weight += this.weigh(item);
    return this.weight < this.mark;
  }

  /** Resolves once what is queued weighs under the mark or the channel ended; undefined if it is already. */
  room(): Promise<void> | undefined {
    if (this.over || this.weight < this.mark) return undefined;
    return new Promise((resolve) => this.roomWaiters.push(resolve));
  }

  /** Ends the iteration once what is queued has been taken; with `err`, it then throws err. */
  end(err?: unknown): void {
    if (this.over) return;
    this.over = true;
    if (err !== undefined) this.afterQueue = { err };
    this.wake();
  }

  /** Ends the iteration at once with `err`; what is queued is dropped. */
  fail(err: unknown): void {
    if (this.failed) return;
    this.failed = true;
    this.over = true;
    this.afterQueue = undefined;
    this.failure = { err };
    this.drop();
    this.wake();
  }

  next(): Promise<IteratorResult<T>> {
    if (this.failure) return this.finalResult();
    if (this.head < this.items.length) {
      const value = this.items[this.head] as T;
      this.items[this.head++] = undefined;
      this.weight -= this.weigh(value);
      if (this.head === this.items.length) {
        this.items.length = 0;
        this.head = 0;
        this.weight = 0;
      }
      if (this.roomWaiters.length > 0 && this.weight < this.mark) this.releaseRoom();
      return Promise.resolve({ value, done: false });
    }
    if (this.over) return this.finalResult();
    return new Promise((resolve, reject) => (this.reader = { resolve, reject }));
  }

  /** The consumer leaves: the channel ends, what is queued is dropped. */
  return(): Promise<IteratorResult<T>> {
    this.over = true;
    this.failed = true;
    this.failure = undefined;
    this.afterQueue = undefined;
    this.drop();
    this.wake();
    return Promise.resolve(DONE);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  private drop(): void {
    this.items = [];
    this.head = 0;
    this.weight = 0;
  }

  /** A waiting reader learns the end (or the failure); producers waiting for room go on. */
  private wake(): void {
    const reader = this.reader;
    if (reader && this.size === 0) {
      this.reader = undefined;
      this.finalResult().then(reader.resolve, reader.reject);
    }
    this.releaseRoom();
  }

  /** What the iteration ends with: done, or (once) the error it ended with. */
  private finalResult(): Promise<IteratorResult<T>> {
    const ended = this.failure ?? this.afterQueue;
    if (!ended || ended.err === undefined) return Promise.resolve(DONE);
    const { err } = ended;
    this.failure = undefined;
    this.afterQueue = undefined;
    return Promise.reject(err);
  }

  private releaseRoom(): void {
    const waiters = this.roomWaiters;
    this.roomWaiters = [];
    for (const resolve of waiters) resolve();
  }
}

const DONE: IteratorResult<never> = { value: undefined, done: true };
