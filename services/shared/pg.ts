// The PostgreSQL store's connection and schema, shared by every service that uses it (runners
// keep sessions there, routers read runner membership from it, `troupe store migrate` upgrades
// it). Selected by TROUPE_STORE_URL=postgres://...; the file store stays the embedded default.
//
// Migrations are numbered and applied in order, each in its own transaction, under an advisory
// lock so that many processes starting at once apply each one exactly once. A process refuses a
// database whose schema is newer than it knows (an older binary must not write a newer layout).
import type pg from "pg";
import { lazyModule } from "./process/lazy-module.js";

/** node-postgres, loaded when first used (a store URL opened, a local server started): the file store never needs it. */
export const pgModule = lazyModule<typeof pg>("pg");

/** Opens a pool on the store URL. The password, if any, never appears in errors (pg omits it). */
export function openPool(url: string, max = 10): pg.Pool {
  const pool = new (pgModule().Pool)({
    connectionString: url,
    max,
    idleTimeoutMillis: 30_000,
    connectionTimeoutMillis: 5000,
  });
  // An idle client whose server went away emits 'error' on the pool; without a listener that
  // would crash the process. The next query reconnects or fails with its own error.
  pool.on("error", () => undefined);
  return pool;
}

/** The schema, one entry per version. Never edit a released entry: add the next one. */
export const MIGRATIONS: readonly string[] = [
  // 1: sessions (their records, leases and epochs), runner membership, schedules, profiles, audit.
  `
  CREATE TABLE troupe_runners (
    runner_id   text PRIMARY KEY,
    address     text NOT NULL,
    incarnation text NOT NULL,
    host        text NOT NULL,
    pid         integer NOT NULL,
    beat_at     timestamptz NOT NULL,
    draining    boolean NOT NULL DEFAULT false
  );
  CREATE TABLE troupe_sessions (
    sid               bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant            text NOT NULL,
    principal         text NOT NULL,
    session_id        text NOT NULL,
    agent_id          text NOT NULL,
    created_ms        bigint NOT NULL,
    update_ms         bigint NOT NULL,
    epoch             integer NOT NULL,
    owner_runner      text,
    owner_incarnation text,
    owner_address     text,
    PRIMARY KEY (tenant, principal, session_id)
  );
  -- Records are keyed by the session's number (sid), not its three text ids: a small index.
  CREATE TABLE troupe_records (
    sid    bigint NOT NULL REFERENCES troupe_sessions (sid) ON DELETE CASCADE,
    pos    integer NOT NULL,
    epoch  integer NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (sid, pos)
  );
  CREATE TABLE troupe_schedules (
    tenant     text NOT NULL,
    principal  text NOT NULL,
    session_id text NOT NULL,
    body       jsonb NOT NULL,
    PRIMARY KEY (tenant, principal, session_id)
  );
  CREATE TABLE troupe_profiles (
    agent_id  text NOT NULL,
    tenant    text NOT NULL,
    principal text NOT NULL,
    body      text NOT NULL,
    PRIMARY KEY (agent_id, tenant, principal)
  );
  CREATE TABLE troupe_audit (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    runner_id text NOT NULL,
    record    jsonb NOT NULL
  );
  `,
  // 2: the sessions each runner holds, for the runners to find what a dead one left (orphans).
  `
  CREATE INDEX troupe_sessions_owner ON troupe_sessions (owner_runner) WHERE owner_runner IS NOT NULL;
  `,
];

const LOCK_ID = 0x7472_6f75; // "trou": the advisory lock that serialises migrations

/** The schema version the database is at (0 when Troupe has never run against it). */
export async function schemaVersion(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ v: number | null }>(
    `SELECT CASE WHEN to_regclass('troupe_schema') IS NULL THEN 0
       ELSE (SELECT coalesce(max(version), 0) FROM troupe_schema) END AS v`,
  );
  return Number(rows[0]?.v ?? 0);
}

/**
 * Brings the schema up to date; returns the versions applied (empty when none were due). Refuses
 * a database that is ahead of this build.
 */
export async function migrate(pool: pg.Pool): Promise<number[]> {
  const client = await pool.connect();
  const applied: number[] = [];
  try {
    await client.query("SELECT pg_advisory_lock($1)", [LOCK_ID]);
    try {
      await client.query(
        "CREATE TABLE IF NOT EXISTS troupe_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
      );
      const { rows } = await client.query<{ v: number | null }>("SELECT max(version) AS v FROM troupe_schema");
      const at = Number(rows[0]?.v ?? 0);
      if (at > MIGRATIONS.length)
        throw new Error(
          `the store's schema is at version ${at} but this build knows only up to ${MIGRATIONS.length}; upgrade Troupe`,
        );
      for (let v = at + 1; v <= MIGRATIONS.length; v++) {
        await client.query("BEGIN");
        try {
          await client.query(MIGRATIONS[v - 1]);
          await client.query("INSERT INTO troupe_schema (version) VALUES ($1)", [v]);
          await client.query("COMMIT");
        } catch (err) {
          await client.query("ROLLBACK").catch(() => undefined);
          throw new Error(`store migration ${v} failed: ${(err as Error).message}`);
        }
        applied.push(v);
      }
    } finally {
      await client.query("SELECT pg_advisory_unlock($1)", [LOCK_ID]).catch(() => undefined);
    }
  } finally {
    client.release();
  }
  return applied;
}

/** A PostgreSQL error's SQLSTATE, if it is one. */
export const sqlState = (err: unknown): string | undefined => (err as { code?: string })?.code;
