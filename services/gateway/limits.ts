// Per-tenant and per-session limits at the gateway, so one tenant (or one runaway session) cannot
// take the runtime from the others:
// - messages that start or change work (prompt, steer, follow-up) draw from a token bucket per
//   tenant and one per session; aborts draw from a bucket of their own per tenant (quotas.ts,
//   abortsPerSecond), so a flood of aborts cannot fill logs and disks, while a spent message
//   budget never stops an abort;
// - open streams (Chat, Subscribe) are capped per tenant.
// A refusal is RESOURCE_EXHAUSTED with a retry hint: the trailer `retry-after-ms` and the same
// figure in the message. Buckets that have refilled are dropped, so idle sessions cost nothing.
import type { LimitsConfig } from "../shared/config/config-types.js";
import { RateLimited, RETRY_AFTER_KEY, TokenBucket } from "../shared/auth/rate.js";

export { RETRY_AFTER_KEY };

export class GatewayLimits {
  private readonly tenants = new Map<string, TokenBucket>();
  private readonly sessions = new Map<string, TokenBucket>();
  private readonly aborts = new Map<string, TokenBucket>();
  private readonly streams = new Map<string, number>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly config: LimitsConfig,
    private readonly now: () => number = Date.now,
  ) {
    this.sweeper = setInterval(() => this.sweep(), 10_000);
    this.sweeper.unref();
  }

  /** One message that starts or changes work in `sessionId` for `tenant`; throws when over a limit. */
  admitMessage(tenant: string, sessionId: string): void {
    const now = this.now();
    const t = this.bucket(this.tenants, tenant, this.config.tenantRate, this.config.tenantBurst, now);
    const s = this.bucket(
      this.sessions,
      `${tenant}\0${sessionId}`,
      this.config.sessionRate,
      this.config.sessionBurst,
      now,
    );
    // Both are checked before either is drawn from, so a refusal costs the caller nothing.
    const tenantWait = t.wait(now);
    if (tenantWait > 0)
      throw new RateLimited(`tenant ${tenant} is over its limit of ${this.config.tenantRate} messages/s`, tenantWait);
    const sessionWait = s.wait(now);
    if (sessionWait > 0)
      throw new RateLimited(
        `session ${sessionId} is over its limit of ${this.config.sessionRate} messages/s`,
        sessionWait,
      );
    t.take();
    s.take();
  }

  /** One abort for `tenant`, at most `perSecond` on average and twice that in a burst. */
  admitAbort(tenant: string, perSecond: number): void {
    const now = this.now();
    const b = this.bucket(this.aborts, tenant, perSecond, perSecond * 2, now);
    const wait = b.wait(now);
    if (wait > 0)
      throw new RateLimited(`tenant ${tenant} is over its quota of ${perSecond} aborts/s`, wait, "QUOTA_EXCEEDED");
    b.take();
  }

  /** A stream opens for `tenant`; returns its release (call once). Throws at the cap. */
  openStream(tenant: string): () => void {
    const n = this.streams.get(tenant) ?? 0;
    if (n >= this.config.tenantStreams)
      throw new RateLimited(`tenant ${tenant} has ${n} streams open, its limit`, 1000, "QUOTA_EXCEEDED");
    this.streams.set(tenant, n + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.streams.get(tenant) ?? 1) - 1;
      if (left <= 0) this.streams.delete(tenant);
      else this.streams.set(tenant, left);
    };
  }

  stop(): void {
    clearInterval(this.sweeper);
  }

  private bucket(map: Map<string, TokenBucket>, key: string, rate: number, burst: number, now: number): TokenBucket {
    let b = map.get(key);
    if (!b) map.set(key, (b = new TokenBucket(rate, burst, now)));
    return b;
  }

  /** A full bucket is the same as no bucket. */
  private sweep(): void {
    const now = this.now();
    for (const map of [this.tenants, this.sessions, this.aborts])
      for (const [k, b] of map) if (b.full(now)) map.delete(k);
  }
}
