// Token buckets and the refusal that says when to come back: RESOURCE_EXHAUSTED with the wait in
// the trailer `retry-after-ms`, in the message, and as gRPC's retry pushback and RetryInfo
// (retry-details.ts). Used by the gateway's limits and the quotas of the runner and the sandbox
// service.
import { RETRY_AFTER_TRAILER, RpcError, Status } from "../errors.js";

export const RETRY_AFTER_KEY = RETRY_AFTER_TRAILER;

/** A refusal that says when to come back. */
export class RateLimited extends RpcError {
  readonly retryAfterMs: number;
  /** ErrorInfo's reason: RATE_LIMITED for a rate, QUOTA_EXCEEDED for a quota. */
  private readonly why: string;
  constructor(message: string, retryAfterMs: number, reason = "RATE_LIMITED") {
    const ms = Math.max(1, Math.ceil(retryAfterMs));
    super(Status.RESOURCE_EXHAUSTED, `${message}; retry in ${ms} ms`);
    this.retryAfterMs = ms;
    this.why = reason;
  }
  override get trailers(): Record<string, string> {
    return { [RETRY_AFTER_KEY]: String(this.retryAfterMs) };
  }
  override get reason(): string {
    return this.why;
  }
}

/** `rate` tokens a second, at most `burst` banked. */
export class TokenBucket {
  private tokens: number;
  private at: number;
  constructor(
    private readonly rate: number,
    private readonly burst: number,
    now: number,
  ) {
    this.tokens = burst;
    this.at = now;
  }

  private refill(now: number): void {
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.at) / 1000) * this.rate);
    this.at = now;
  }

  /** How many ms until a token is there (0: now). */
  wait(now: number): number {
    this.refill(now);
    return this.tokens >= 1 ? 0 : ((1 - this.tokens) / this.rate) * 1000;
  }

  take(): void {
    this.tokens -= 1;
  }

  full(now: number): boolean {
    this.refill(now);
    return this.tokens >= this.burst;
  }
}

/** Buckets by key, made full on first use and dropped once full again (an idle key costs nothing). */
export class Buckets {
  private readonly map = new Map<string, TokenBucket>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(private readonly now: () => number = Date.now) {
    this.sweeper = setInterval(() => this.sweep(), 10_000);
    this.sweeper.unref();
  }

  get(key: string, rate: number, burst: number): TokenBucket {
    let b = this.map.get(key);
    if (!b) this.map.set(key, (b = new TokenBucket(rate, burst, this.now())));
    return b;
  }

  /** Takes a token from `key`'s bucket, or throws RateLimited saying `what` and when to retry. */
  take(key: string, rate: number, burst: number, what: string): void {
    const b = this.get(key, rate, burst);
    const wait = b.wait(this.now());
    if (wait > 0) throw new RateLimited(what, wait);
    b.take();
  }

  stop(): void {
    clearInterval(this.sweeper);
  }

  private sweep(): void {
    const now = this.now();
    for (const [k, b] of this.map) if (b.full(now)) this.map.delete(k);
  }
}
