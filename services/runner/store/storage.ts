// Everything a runner keeps, behind one interface: session logs with their leases and epochs,
// schedules, owners' profiles, the audit log, and the runner's membership among the runners
// sharing the storage (its heartbeat: while it beats, the others treat its sessions as live). The server is given a
// RunnerStorage and nothing else about where state lives: files in a data directory (one machine,
// or runners sharing one POSIX volume), PostgreSQL (any number of machines), or this process.
import path from "node:path";
import type pg from "pg";
import { RunnerHeartbeat } from "../../shared/membership.js";
import { migrate, openPool } from "../../shared/pg.js";
import {
  AuditLog,
  auditMatches,
  type AuditQuery,
  type AuditRecord,
  type AuditSink,
  type StoredAudit,
} from "./audit-log.js";
import { PgSessionStore } from "./pg-session-store.js";
import { PgAuditLog, PgProfileStore, PgScheduleStore } from "./pg-stores.js";
import { InMemoryScheduleStore, InMemorySessionStore } from "./in-memory-store.js";
import { FileProfileStore, InMemoryProfileStore, type ProfileStore } from "./profile-store.js";
import { FileScheduleStore, type ScheduleStore } from "./schedule-files.js";
import type { Owner } from "../session/session-lease.js";
import { JsonlSessionStore } from "./jsonl-session-store.js";
import type { SessionStore } from "../session/session-log.js";

export interface RunnerStorage {
  readonly sessions: SessionStore;
  readonly schedules: ScheduleStore;
  readonly profiles: ProfileStore;
  readonly audit: AuditSink;
  /**
   * Where the runners sharing it are known from: the store itself (its heartbeat, read by every
   * router), or the router, which the runner registers with.
   */
  readonly membership: "store" | "router";
  /** Joins the runners sharing this storage (and brings older layouts up to date). Call before serving. */
  start(): Promise<void>;
  /** Stops new sessions being placed here (the router skips draining runners); held ones stay. */
  drain(): Promise<void>;
  /** Leaves them; call after every session log is closed. */
  stop(): Promise<void>;
}

/**
 * The file store in a data directory (sessions/, runners/, schedules/, profiles/). Runners that
 * share the directory arbitrate sessions through it (session-lease.ts).
 */
export function fileStorage(
  dataDir: string,
  self: Owner,
  livenessMs: number,
  /** Called for a schedule file that cannot be read (it is skipped). Contract: never throws. */
  damagedSchedule: (file: string) => void,
): RunnerStorage {
  const sessions = new JsonlSessionStore(dataDir, self, livenessMs);
  const schedules = new FileScheduleStore(path.join(dataDir, "schedules"), damagedSchedule);
  return {
    sessions,
    schedules,
    profiles: new FileProfileStore(path.join(dataDir, "profiles")),
    audit: new AuditLog(dataDir),
    membership: "router",
    async start() {
      await sessions.start();
      await schedules.migrate();
    },
    // The file store's membership is the router's (registration.ts), which is told directly.
    drain: async () => undefined,
    async stop() {
      await sessions.stop();
      await this.audit.close();
    },
  };
}

/**
 * PostgreSQL at `url` (shared/pg.ts): sessions fenced by epoch in the database, membership in
 * troupe_runners, schedules, profiles and the audit log in their tables. start() migrates the
 * schema (each migration once, whoever starts first) and begins the heartbeat.
 */
export function pgStorage(
  url: string,
  self: Owner,
  livenessMs: number,
  /** Told when the heartbeat fails or the runner id was taken. Contract: never throws. */
  trouble: (message: string) => void,
  /** Told when this runner was silent past its lease (RunnerHeartbeat). Contract: never throws. */
  lapsed: (silentMs: number) => void = () => undefined,
): RunnerStorage & { pool: pg.Pool; sessions: PgSessionStore } {
  const pool = openPool(url, 16);
  const heartbeat = new RunnerHeartbeat(pool, self, livenessMs, trouble, lapsed);
  const audit = new PgAuditLog(pool, self.runnerId);
  return {
    pool,
    sessions: new PgSessionStore(pool, self, livenessMs),
    schedules: new PgScheduleStore(pool),
    profiles: new PgProfileStore(pool),
    audit,
    membership: "store",
    async start() {
      await migrate(pool);
      await heartbeat.start();
    },
    drain: () => heartbeat.drain(),
    async stop() {
      await audit.close();
      await heartbeat.stop();
      await pool.end();
    },
  };
}

/** Everything in this process: the in-process tests' storage (no durability, the same contracts). */
export function inMemoryStorage(): RunnerStorage & {
  sessions: InMemorySessionStore;
  schedules: InMemoryScheduleStore;
  profiles: InMemoryProfileStore;
} {
  return {
    sessions: new InMemorySessionStore(),
    schedules: new InMemoryScheduleStore(),
    profiles: new InMemoryProfileStore(),
    audit: new InMemoryAudit(),
    membership: "router",
    start: async () => undefined,
    drain: async () => undefined,
    stop: async () => undefined,
  };
}

/** Audit records kept in this process, readable by tests. */
export class InMemoryAudit implements AuditSink {
  readonly shared = false;
  readonly records: StoredAudit[] = [];
  async record(rec: AuditRecord): Promise<void> {
    this.records.push({ timeMs: Date.now(), record: structuredClone(rec) });
  }
  async read(q: AuditQuery): Promise<StoredAudit[]> {
    return this.records
      .filter((a) => auditMatches(a.record, q))
      .reverse()
      .slice(0, q.limit);
  }
  async close(): Promise<void> {}
}
