// A queue between producers that push synchronously (a session's events, a runner's bytes, a
// client's frames) and one consumer. It is how a stream handler hands its responses to the server
// when they come from callbacks rather than from a loop of its own.
//
// Contract:
// - push() queues an item and says whether what is queued is still under its mark; past the mark
//   a producer that can wait awaits room() (resolves once the consumer took it below);
// - end() ends it after what is queued (with end(err), the consumer then gets err); fail(err)
//   ends it at once with err, dropping what is queued, even after end(); each counts once, and a
//   push after either is dropped;
// - the consumer either iterates (for await, next) or sinks (sinkTo: items written synchronously
//   as they come, the server's way: a promise and an iterator result per token cost the token
//   path a tenth of its CPU and its tail, bench/stream); not both;
// - the consumer leaving (a `for await` that breaks, or return()) ends it too: what is queued is
//   dropped and the producer's room() waiters are released.

/** Items a channel holds before push() reports it full, unless told otherwise. */
export const CHANNEL_MARK = 64;
/** A mark for a channel of bytes, weighed by their length: what one Node stream buffers. */
export const BYTES_MARK = 64 * 1024;

/** How much an item of bytes weighs: its length. */
export const byteLength = (item: Uint8Array | object): number => (item instanceof Uint8Array ? item.length : 64);

type Waiter<T> = { resolve(r: IteratorResult<T>): void; reject(err: unknown): void };

/** A consumer that takes items synchronously while it has room (sinkTo). */
interface Sink<T> {
  write(item: T): boolean;
  blocked: boolean;
  resolve(): void;
  reject(err: unknown): void;
}

export class Channel<T> implements AsyncIterableIterator<T> {
  private items: (T | undefined)[] = [];
  private head = 0;
  /** What the queued items weigh (their count, unless a weigh function was given). */
  private weight = 0;
  private reader?: Waiter<T>;
  private sink?: Sink<T>;
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

  /** What the queued items weigh (their bytes, for a channel of bytes weighed by byteLength). */
  get queuedWeight(): number {
    return this.weight;
  }

  /** Whether it ended (end, fail or the consumer left): pushes are dropped. */
  get closed(): boolean {
    return this.over;
  }

  /** Queues `item`; false once what is queued weighs its mark (await room() before the next, if you can wait). */
  push(item: T): boolean {
    if (this.over) return true;
    const sink = this.sink;
    if (sink && !sink.blocked && this.size === 0) {
      if (!sink.write(item)) sink.blocked = true;
      return true;
    }
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

  /** Ends it once what is queued has been taken; with `err`, the consumer then gets err. */
  end(err?: unknown): void {
    if (this.over) return;
    this.over = true;
    if (err !== undefined) this.afterQueue = { err };
    this.wake();
  }

  /** Ends it at once with `err`; what is queued is dropped. */
  fail(err: unknown): void {
    if (this.failed) return;
    this.failed = true;
    this.over = true;
    this.afterQueue = undefined;
    this.failure = { err };
    this.drop();
    this.wake();
  }

  /**
   * Consumes by writing: each item goes to `write` as it is pushed, while `write` reports room;
   * after it reports none, items queue until flush(). Resolves once the channel ended and all it
   * held was written; rejects with the error it ended with.
   */
  sinkTo(write: (item: T) => boolean): Promise<void> {
    return new Promise((resolve, reject) => {
      this.sink = { write, blocked: false, resolve, reject };
      this.flush();
    });
  }

  /** The sink has room again: what is queued is written until it has none, or all is. */
  flush(): void {
    const sink = this.sink;
    if (!sink) return;
    sink.blocked = false;
    while (this.head < this.items.length) {
      if (!sink.write(this.take())) {
        sink.blocked = true;
        break;
      }
    }
    this.wake();
  }

  next(): Promise<IteratorResult<T>> {
    if (this.failure) return this.finalResult();
    if (this.head < this.items.length) return Promise.resolve({ value: this.take(), done: false });
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

  /** The oldest queued item, taken off the queue. */
  private take(): T {
    const value = this.items[this.head] as T;
    this.items[this.head++] = undefined;
    this.weight -= this.weigh(value);
    if (this.head === this.items.length) {
      this.items.length = 0;
      this.head = 0;
      this.weight = 0;
    }
    if (this.roomWaiters.length > 0 && this.weight < this.mark) this.releaseRoom();
    return value;
  }

  private drop(): void {
    this.items = [];
    this.head = 0;
    this.weight = 0;
  }

  /** A waiting consumer learns the end (or the failure); producers waiting for room go on. */
  private wake(): void {
    const reader = this.reader;
    if (reader && this.size === 0) {
      this.reader = undefined;
      this.finalResult().then(reader.resolve, reader.reject);
    }
    const sink = this.sink;
    if (sink && this.over && this.size === 0) {
      this.sink = undefined;
      this.finalResult().then(() => sink.resolve(), sink.reject);
    }
    if (this.over || this.weight < this.mark) this.releaseRoom();
  }

  /** What the consumer ends with: done, or (once) the error the channel ended with. */
  private finalResult(): Promise<IteratorResult<T>> {
    const ended = this.failure ?? this.afterQueue;
    if (!ended || ended.err === undefined) return Promise.resolve(DONE);
    const { err } = ended;
    this.failure = undefined;
    this.afterQueue = undefined;
    return Promise.reject(err);
  }

  private releaseRoom(): void {
    if (this.roomWaiters.length === 0) return;
    const waiters = this.roomWaiters;
    this.roomWaiters = [];
    for (const resolve of waiters) resolve();
  }
}

const DONE: IteratorResult<never> = { value: undefined, done: true };
