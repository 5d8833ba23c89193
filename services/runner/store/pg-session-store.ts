// Session logs in PostgreSQL: the SessionStore contract (session-log.ts) over three tables
// (shared/pg.ts). A session is a troupe_sessions row (its owner, its lease and its epoch) and its
// records in troupe_records, numbered by pos.
//
// Fencing is the database's: every write of a session's records is one statement that also updates
// the session's row *where its epoch is the writer's*. An activation elsewhere bumps the epoch under
// the row's lock, so once it commits, a writer of an older epoch (a runner paused past its lease,
// then resumed) matches no row and its records are refused, not merely ignored by readers.
//
// The lease: a session's row names the incarnation (one runner process) that holds it. It holds
// while that incarnation's membership row beats (shared/membership.ts); a runner that stopped
// beating for livenessMs, or left, no longer holds anything, and the next activation takes over.
import type pg from "pg";
import type { Identity } from "../../shared/auth/auth.js";
import type { SessionRef } from "../../shared/session-ref.js";
import { holderAlive, PgActivations } from "./pg-activation.js";
import { PgAppender } from "./pg-appender.js";
import type { Owner } from "../session/session-lease.js";
import {
  ownerOf,
  sessionHeader,
  sessionNotThere,
  type LogRecord,
  type SessionLog,
  type SessionOwner,
  type SessionStore,
  type StoredSession,
  type Subagent,
} from "../session/session-log.js";

const KEY = "tenant = $1 AND principal = $2 AND session_id = $3";
const keyOf = (ref: SessionRef) => [ref.tenant, ref.principal, ref.sessionId];

/** One activation's log: appends go through the store's appender at this epoch, from `nextPos` on. */
class PgSessionLog implements SessionLog {
  private closed = false;

  constructor(
    private readonly store: PgSessionStore,
    readonly ref: SessionRef,
    readonly epoch: number,
    private readonly writer: ReturnType<PgAppender["writer"]>,
  ) {}

  append(record: LogRecord, _sync = false): Promise<void> {
    // Every commit is durable (synchronous_commit), so `sync` asks for nothing more.
    return this.writer.append(JSON.stringify(record));
  }

  flush(): Promise<void> {
    return this.writer.flush();
  }

  async close(options: { keepLease?: boolean } = {}): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.writer.flush().catch(() => undefined);
    if (!options.keepLease) await this.store.release(this.ref, this.epoch);
  }
}

export class PgSessionStore implements SessionStore {
  readonly appender: PgAppender;
  readonly activations: PgActivations;

  constructor(
    private readonly pool: pg.Pool,
    readonly self: Owner,
    /** A lease whose holder has not beaten for this long is free. */
    private readonly livenessMs: number,
  ) {
    this.appender = new PgAppender(pool);
    this.activations = new PgActivations(pool, self, livenessMs);
  }

  async exists(ref: SessionRef): Promise<boolean> {
    const { rowCount } = await this.pool.query(`SELECT 1 FROM troupe_sessions WHERE ${KEY}`, keyOf(ref));
    return (rowCount ?? 0) > 0;
  }

  async create(
    ref: SessionRef,
    agentId: string,
    owner: SessionOwner,
    subagent?: Subagent,
    opening: LogRecord[] = [],
  ): Promise<SessionLog> {
    const header = sessionHeader(ref, agentId, owner, subagent) as Extract<LogRecord, { t: "session" }>;
    const records = [header, { t: "epoch", epoch: 1, runnerId: this.self.runnerId }, ...opening];
    // One statement: the row and its first records exist together or not at all.
    const { rows } = await this.pool.query<{ sid: string }>(
      `WITH s AS (
         INSERT INTO troupe_sessions (tenant, principal, session_id, agent_id, created_ms, update_ms, epoch,
                                      owner_runner, owner_incarnation, owner_address)
         VALUES ($1, $2, $3, $4, $5, $5, 1, $6, $7, $8)
         ON CONFLICT DO NOTHING RETURNING sid
       ), r AS (
         INSERT INTO troupe_records (sid, pos, epoch, record)
         SELECT s.sid, u.i - 1, 1, u.rec FROM s, unnest($9::text[]) WITH ORDINALITY AS u(rec, i)
       )
       SELECT sid FROM s`,
      [
        ...keyOf(ref),
        agentId,
        header.createdMs,
        this.self.runnerId,
        this.self.incarnation,
        this.self.address,
        records.map((r) => JSON.stringify(r)),
      ],
    );
    if (rows.length === 0) throw Object.assign(new Error(`session ${ref.sessionId} exists`), { code: "EEXIST" });
    return new PgSessionLog(this, ref, 1, this.appender.writer(ref, String(rows[0].sid), 1, records.length));
  }

  async activate(ref: SessionRef): Promise<{ log: SessionLog; records: LogRecord[]; corruptLines: number[] }> {
    const taken = await this.activations.activate(ref);
    const { records, corruptLines } = parseRows(taken.rows);
    records.push(taken.mark);
    return {
      log: new PgSessionLog(this, ref, taken.epoch, this.appender.writer(ref, taken.sid, taken.epoch, taken.nextPos)),
      records,
      corruptLines,
    };
  }

  /** Gives up the lease of `epoch` (if it still holds it), so the next activation anywhere is immediate. */
  async release(ref: SessionRef, epoch: number): Promise<void> {
    await this.pool
      .query(
        `UPDATE troupe_sessions SET owner_runner = NULL, owner_incarnation = NULL, owner_address = NULL
          WHERE ${KEY} AND epoch = $4`,
        [...keyOf(ref), epoch],
      )
      .catch(() => undefined);
  }

  async read(ref: SessionRef): Promise<LogRecord[]> {
    const { rows } = await this.pool.query<{ pos: number; record: string }>(
      `SELECT r.pos, r.record FROM troupe_records r JOIN troupe_sessions USING (sid) WHERE ${KEY} ORDER BY r.pos`,
      keyOf(ref),
    );
    const { records } = parseRows(rows);
    if (records[0]?.t !== "session") throw sessionNotThere(ref);
    return records;
  }

  async list(owner?: Identity): Promise<StoredSession[]> {
    const { rows } = await this.pool.query<{
      tenant: string;
      principal: string;
      session_id: string;
      agent_id: string;
      created_ms: string;
      update_ms: string;
      header: string;
    }>(
      `SELECT s.tenant, s.principal, s.session_id, s.agent_id, s.created_ms, s.update_ms, h.record AS header
         FROM troupe_sessions s JOIN troupe_records h USING (sid)
        WHERE h.pos = 0 ${owner ? "AND s.tenant = $1 AND s.principal = $2" : ""}`,
      owner ? [owner.tenant, owner.principal] : [],
    );
    return rows.map((r) => {
      const head = JSON.parse(r.header) as Extract<LogRecord, { t: "session" }>;
      return {
        sessionId: r.session_id,
        agentId: r.agent_id,
        owner: ownerOf(head),
        createdMs: Number(r.created_ms),
        updateMs: Number(r.update_ms),
        ...(head.subagent ? { parentSessionId: head.subagent.parentSessionId } : {}),
      };
    });
  }

  async orphans(): Promise<SessionRef[]> {
    // A row names its holder until the holder closes it (release); migration 2 indexes holders.
    // Gone: an earlier process of this runner, or a holder that is not alive by the test
    // activate() makes under the row's lock. Settled logs (settledLog: the last record that is
    // not an epoch, a seq or a close is settled; records start with their "t") owe nothing.
    const { rows } = await this.pool.query<{ tenant: string; principal: string; session_id: string }>(
      `SELECT s.tenant, s.principal, s.session_id
         FROM troupe_sessions s
        WHERE s.owner_runner IS NOT NULL AND s.owner_incarnation <> $3
          AND ((s.owner_runner = $1 AND s.owner_address = $2)
               OR NOT ${holderAlive("s.owner_runner", "s.owner_incarnation", "$4")})
          AND NOT coalesce((SELECT l.record LIKE '{"t":"settled"%'
                              FROM troupe_records l
                             WHERE l.sid = s.sid AND l.record NOT LIKE '{"t":"epoch"%'
                               AND l.record NOT LIKE '{"t":"seq"%' AND l.record NOT LIKE '{"t":"closed"%'
                             ORDER BY l.pos DESC LIMIT 1), false)`,
      [this.self.runnerId, this.self.address, this.self.incarnation, this.livenessMs],
    );
    return rows.map((r) => ({ tenant: r.tenant, principal: r.principal, sessionId: r.session_id }));
  }

  async remove(ref: SessionRef): Promise<boolean> {
    const { rowCount } = await this.pool.query(`DELETE FROM troupe_sessions WHERE ${KEY}`, keyOf(ref));
    return (rowCount ?? 0) > 0;
  }
}

/** Records from rows; a row that does not parse (a hand edit) is skipped and reported by its pos + 1. */
function parseRows(rows: { pos: number; record: string }[]): { records: LogRecord[]; corruptLines: number[] } {
  const records: LogRecord[] = [];
  const corruptLines: number[] = [];
  for (const row of rows) {
    try {
      const rec = JSON.parse(row.record) as LogRecord;
      if (typeof rec !== "object" || rec === null || typeof rec.t !== "string") throw new Error("not a record");
      records.push(rec);
    } catch {
      corruptLines.push(row.pos + 1);
    }
  }
  return { records, corruptLines };
}
