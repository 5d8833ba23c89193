// Activations on the PostgreSQL store, batched. When a runner dies, its sessions are asked for
// elsewhere all at once; activating each in its own transaction cost six round trips and six
// socket writes a session, and those writes were most of a surviving runner's CPU in
// bench/cluster. Activations that arrive while a batch is in flight are taken together by the
// next: one transaction of two statements however many sessions it holds.
//
// 1. claim: locks the sessions' rows (in sid order, so that two runners' batches never deadlock
//    each other), and takes the next epoch of each whose holder is gone, is this process, or is
//    an earlier process of this runner. A session held by a live runner is left as it is. The
//    holder is judged after the lock: READ COMMITTED hands a row another runner updated while
//    this statement waited back in its new version, but a table joined to it stays as it was.
// 2. read: the taken sessions' records, in a fresh snapshot taken after the locks (a stale
//    holder's last appends, committed while the claim waited on its lock, are read), and each
//    one's epoch record appended after them.
//
// The transaction commits both, so a taken epoch always has its mark, as one activation's did.
import type pg from "pg";
import { sqlState } from "../../shared/pg.js";
import { refKey, type SessionRef } from "../../shared/session-ref.js";
import { SessionElsewhere, type Owner } from "../session/session-lease.js";
import { sessionNotThere, type LogRecord } from "../session/session-log.js";

/** What activating one session found: where its log goes on, and the rows it held. */
export interface Activation {
  sid: string;
  epoch: number;
  /** The rows before this activation's epoch record, in pos order. */
  rows: { pos: number; record: string }[];
  /** The epoch record appended, and the pos after it. */
  mark: LogRecord;
  nextPos: number;
}

interface Pending {
  ref: SessionRef;
  resolve(a: Activation): void;
  reject(err: unknown): void;
}

/**
 * Whether the runner named by the columns `runner` and `incarnation` still holds what they name:
 * its membership row is that incarnation's and beat within `livenessMs`, the query parameter
 * named. Activation and the orphan sweep judge a holder by this one test.
 */
export const holderAlive = (runner: string, incarnation: string, livenessMs: string) =>
  `EXISTS (SELECT 1 FROM troupe_runners r
            WHERE r.runner_id = ${runner} AND r.incarnation = ${incarnation}
              AND r.beat_at > now() - ${livenessMs} * interval '1 millisecond')`;

const CLAIM_SQL = `
  WITH q AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS q(tenant, principal, session_id)
  ), held AS (
    SELECT s.sid, s.tenant, s.principal, s.session_id, s.owner_runner AS runner, s.owner_address,
           s.owner_incarnation AS incarnation
      FROM troupe_sessions s
      JOIN q ON q.tenant = s.tenant AND q.principal = s.principal AND q.session_id = s.session_id
     ORDER BY s.sid
       FOR UPDATE OF s
  ), judged AS (
    -- Judged after the lock, on the holder the row names now: a row another runner took while
    -- this statement waited comes back as that runner left it, and its membership is read here,
    -- not joined before the lock (a join's row would be the old holder's).
    SELECT h.*, coalesce(h.incarnation = $4, false) AS mine, ${holderAlive("h.runner", "h.incarnation", "$7")} AS alive
      FROM held h
  ), taken AS (
    UPDATE troupe_sessions s SET epoch = s.epoch + 1, owner_runner = $5, owner_incarnation = $4, owner_address = $6
      FROM judged h
     WHERE s.sid = h.sid AND (NOT h.alive OR h.mine OR (h.runner = $5 AND h.owner_address = $6))
    RETURNING s.sid, s.epoch
  )
  SELECT h.sid, h.tenant, h.principal, h.session_id, h.runner, h.owner_address, t.epoch
    FROM judged h LEFT JOIN taken t ON t.sid = h.sid`;

const READ_SQL = `
  WITH t AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[]) AS t(sid, epoch, mark)
  ), marked AS (
    INSERT INTO troupe_records (sid, pos, epoch, record)
    SELECT t.sid, coalesce((SELECT max(r.pos) FROM troupe_records r WHERE r.sid = t.sid), -1) + 1, t.epoch, t.mark
      FROM t
    RETURNING sid, pos
  )
  SELECT r.sid, r.pos, r.record FROM troupe_records r JOIN t ON t.sid = r.sid
  UNION ALL
  SELECT m.sid, m.pos, NULL FROM marked m
  ORDER BY 1, 2`;

export class PgActivations {
  private queue: Pending[] = [];
  private running = false;
  /** Batches written and sessions in them, for the benchmark and the tests. */
  readonly stats = { batches: 0, sessions: 0 };

  constructor(
    private readonly pool: pg.Pool,
    private readonly self: Owner,
    private readonly livenessMs: number,
    /** The most sessions one batch claims (the rest wait for the next). */
    private readonly maxBatch = 256,
  ) {}

  /** Takes the session for this process; ENOENT when it does not exist, SessionElsewhere when live elsewhere. */
  activate(ref: SessionRef): Promise<Activation> {
    return new Promise((resolve, reject) => {
      this.queue.push({ ref, resolve, reject });
      if (!this.running) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.running = true;
    while (this.queue.length > 0) {
      // One session once a batch: a second activation of it waits for the next, and meets the first.
      const batch = new Map<string, Pending>();
      const later: Pending[] = [];
      for (const p of this.queue) {
        const key = refKey(p.ref);
        if (batch.size < this.maxBatch && !batch.has(key)) batch.set(key, p);
        else later.push(p);
      }
      this.queue = later;
      await this.run([...batch.values()]);
    }
    this.running = false;
  }

  private async run(batch: Pending[]): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        const found = await this.claim(batch);
        this.stats.batches++;
        this.stats.sessions += batch.length;
        for (const p of batch) {
          const got = found.get(refKey(p.ref));
          if (got instanceof Error) p.reject(got);
          else if (got) p.resolve(got);
          else p.reject(sessionNotThere(p.ref));
        }
        return;
      } catch (err) {
        // A stale holder's append touching the same rows in another order can deadlock once.
        const conflict = sqlState(err) === "40P01" || sqlState(err) === "40001";
        if (conflict && attempt === 0) continue;
        const failure = conflict ? new SessionElsewhere("the session is being taken elsewhere") : err;
        for (const p of batch) p.reject(failure);
        return;
      }
    }
  }

  /** One transaction: what each ref found, by its key (absent: no such session). */
  private async claim(batch: Pending[]): Promise<Map<string, Activation | SessionElsewhere>> {
    const client = await this.pool.connect();
    try {
      await client.query("BEGIN");
      try {
        const { rows } = await client.query<{
          sid: string;
          tenant: string;
          principal: string;
          session_id: string;
          runner: string | null;
          owner_address: string | null;
          epoch: number | null;
        }>(CLAIM_SQL, [
          batch.map((p) => p.ref.tenant),
          batch.map((p) => p.ref.principal),
          batch.map((p) => p.ref.sessionId),
          this.self.incarnation,
          this.self.runnerId,
          this.self.address,
          this.livenessMs,
        ]);
        const found = new Map<string, Activation | SessionElsewhere>();
        const taken: { key: string; sid: string; epoch: number; mark: LogRecord }[] = [];
        for (const row of rows) {
          const key = refKey({ tenant: row.tenant, principal: row.principal, sessionId: row.session_id });
          if (row.epoch === null) {
            found.set(
              key,
              new SessionElsewhere(
                `session ${row.session_id} is live on runner ${row.runner} (${row.owner_address}); this runner does not activate a second copy`,
                row.owner_address ?? undefined,
              ),
            );
          } else {
            const mark: LogRecord = { t: "epoch", epoch: row.epoch, runnerId: this.self.runnerId };
            taken.push({ key, sid: row.sid, epoch: row.epoch, mark });
          }
        }
        if (taken.length > 0) {
          const read = await client.query<{ sid: string; pos: number; record: string | null }>(READ_SQL, [
            taken.map((t) => t.sid),
            taken.map((t) => t.epoch),
            taken.map((t) => JSON.stringify(t.mark)),
          ]);
          const bySid = new Map(taken.map((t) => [t.sid, { ...t, rows: [] as Activation["rows"], nextPos: 0 }]));
          for (const r of read.rows) {
            const t = bySid.get(String(r.sid))!;
            if (r.record === null) t.nextPos = r.pos + 1;
            else t.rows.push({ pos: r.pos, record: r.record });
          }
          for (const t of bySid.values())
            found.set(t.key, { sid: t.sid, epoch: t.epoch, rows: t.rows, mark: t.mark, nextPos: t.nextPos });
        }
        await client.query("COMMIT");
        return found;
      } catch (err) {
        await client.query("ROLLBACK").catch(() => undefined);
        throw err;
      }
    } finally {
      client.release();
    }
  }
}
