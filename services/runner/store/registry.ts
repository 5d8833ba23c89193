// The runner's storage by store kind (shared/store-kind.ts): what TROUPE_STORE_URL names becomes
// one RunnerStorage (storage.ts), and the server knows nothing more of where state lives.
import type { StoreKind } from "../../shared/store-kind.js";
import type { Owner } from "../session/session-lease.js";
import { fileStorage, pgStorage, type RunnerStorage } from "./storage.js";

/** What any storage is made from; each kind takes what it needs. */
export interface StorageOptions {
  url: string;
  dataDir: string;
  self: Owner;
  livenessMs: number;
  /** A schedule file that cannot be read (it is skipped). Contract: never throws. */
  damagedSchedule(file: string): void;
  /** The store's trouble (a failed heartbeat, a runner id taken). Contract: never throws. */
  trouble(message: string): void;
  /** This runner was silent past its lease. Contract: never throws. */
  lapsed(silentMs: number): void;
}

export const RUNNER_STORES: Readonly<Record<StoreKind, (o: StorageOptions) => RunnerStorage>> = {
  file: (o) => fileStorage(o.dataDir, o.self, o.livenessMs, o.damagedSchedule),
  postgres: (o) => pgStorage(o.url, o.self, o.livenessMs, o.trouble, o.lapsed),
};
