// Where the router learns which runners are live, by store kind (shared/store-kind.ts): on the
// file store, the runners that registered with this router and renew a lease (one router); on
// PostgreSQL, the runners beating in the store (shared/membership.ts), so any number of routers agree.
import { create } from "@bufbuild/protobuf";
import type pg from "pg";
import { unavailable } from "../shared/errors.js";
import { RunnerInfoSchema, type RunnerInfo } from "../shared/gen/troupe/v1/router_pb.js";
import { liveRunners } from "../shared/membership.js";
import { openPool } from "../shared/pg.js";
import type { StoreKind } from "../shared/store-kind.js";

export const LEASE_TTL_MS = 6000;

interface Lease {
  runner: RunnerInfo;
  expires: number;
  draining: boolean;
}

/** Where live runners are known from. */
export interface Membership {
  live(): Promise<RunnerInfo[]>;
}

/** The runners that registered with this router and renew their lease (the file store's membership). */
export class RunnerDirectory implements Membership {
  private readonly leases = new Map<string, Lease>();

  renew(runner: RunnerInfo, draining: boolean, now = Date.now()): void {
    this.leases.set(runner.runnerId, { runner, expires: now + LEASE_TTL_MS, draining });
  }

  async live(): Promise<RunnerInfo[]> {
    return this.liveNow();
  }

  liveNow(now = Date.now()): RunnerInfo[] {
    const out: RunnerInfo[] = [];
    for (const [id, lease] of this.leases) {
      if (lease.expires < now) this.leases.delete(id);
      else if (!lease.draining) out.push(lease.runner);
    }
    return out;
  }
}

/**
 * The runners beating in the PostgreSQL store, read at most every `refreshMs` (one query shared
 * by every call in that time); when the store cannot be read, the last answer serves for a
 * liveness period, then placement fails UNAVAILABLE rather than guess.
 */
export class StoreMembership implements Membership {
  private cached?: { at: number; runners: RunnerInfo[] };
  private inflight?: Promise<RunnerInfo[]>;

  constructor(
    private readonly pool: pg.Pool,
    private readonly livenessMs: number,
    private readonly refreshMs = 500,
  ) {}

  live(): Promise<RunnerInfo[]> {
    const now = Date.now();
    if (this.cached && now - this.cached.at < this.refreshMs) return Promise.resolve(this.cached.runners);
    this.inflight ??= liveRunners(this.pool, this.livenessMs)
      .then((rows) => {
        const runners = rows.map((r) => create(RunnerInfoSchema, r));
        this.cached = { at: Date.now(), runners };
        return runners;
      })
      .catch((err) => {
        if (this.cached && Date.now() - this.cached.at < this.livenessMs) return this.cached.runners;
        throw unavailable(`the store cannot be read for runner membership: ${(err as Error).message}`);
      })
      .finally(() => {
        this.inflight = undefined;
      });
    return this.inflight;
  }
}

/** One store kind's membership, what to say when it knows no live runner, and how to let it go. */
export interface MembershipSource {
  membership: Membership;
  noneLive: string;
  close(): Promise<void>;
}

export const MEMBERSHIPS: Readonly<
  Record<StoreKind, (url: string, livenessMs: number, directory: RunnerDirectory) => MembershipSource>
> = {
  file: (_url, _livenessMs, directory) => ({
    membership: directory,
    noneLive: "no runner is registered with the router yet; start one with `troupe runner`",
    close: async () => undefined,
  }),
  postgres: (url, livenessMs) => {
    const pool = openPool(url, 4);
    return {
      membership: new StoreMembership(pool, livenessMs),
      noneLive: "no runner is live in the store; start one with `troupe serve runner` and the same TROUPE_STORE_URL",
      close: () => pool.end(),
    };
  },
};
