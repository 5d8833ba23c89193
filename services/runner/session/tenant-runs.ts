// Runs going at once, per tenant, in this runner: a message that would start a run in an idle
// session is refused while its tenant is at its quota (quotas.ts, concurrentRuns). Runs already
// admitted (queued behind another of the same session, recovered from a log, fired by a schedule)
// are counted but never refused: refusing them would drop work that was acknowledged.
import { RateLimited } from "../../shared/auth/rate.js";
import type { TenantQuotas } from "../../shared/auth/quotas.js";

/** How long a refused caller is told to wait: about one model call. */
const RETRY_AFTER_MS = 2000;

export class TenantRuns {
  private readonly going = new Map<string, number>();

  constructor(private readonly quotas: TenantQuotas) {}

  /** Throws RateLimited when `tenant` may not start another run now. */
  admit(tenant: string): void {
    const limit = this.quotas.of(tenant).concurrentRuns;
    const n = this.going.get(tenant) ?? 0;
    if (n >= limit)
      throw new RateLimited(`tenant ${tenant} has ${n} runs going, its quota`, RETRY_AFTER_MS, "QUOTA_EXCEEDED");
  }

  started(tenant: string): void {
    this.going.set(tenant, (this.going.get(tenant) ?? 0) + 1);
  }

  ended(tenant: string): void {
    const left = (this.going.get(tenant) ?? 1) - 1;
    if (left <= 0) this.going.delete(tenant);
    else this.going.set(tenant, left);
  }

  count(tenant: string): number {
    return this.going.get(tenant) ?? 0;
  }
}
