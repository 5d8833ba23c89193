// Group commit for the PostgreSQL store: appends from every session of this runner that arrive
// while a write is in flight are written together by the next one, in one statement and one
// commit, so the cost per record stays near the file store's however many sessions are busy.
//
// The statement is also the fence (pg-session-store.ts): it updates each session's row only where
// the epoch is the writer's, and inserts the records of the sessions it matched. A session whose
// row did not match was taken over: its records are refused and its writer fails for good, as
// a file log does after a failed write (nothing is acknowledged past a hole).
import type pg from "pg";
import { sqlState } from "../../shared/pg.js";
import type { SessionRef } from "../../shared/session-ref.js";
import { SessionElsewhere } from "../session/session-lease.js";
import { appendStarted } from "./append-telemetry.js";

interface Pending {
  writer: SessionWriter;
  pos: number;
  record: string;
  resolve(): void;
  reject(err: unknown): void;
}

/** One activation's position in its session's records; appends through it keep their order. */
class SessionWriter {
  failed?: unknown;
  /** Resolves when every append made so far is settled. */
  last: Promise<void> = Promise.resolve();

  constructor(
    private readonly appender: PgAppender,
    readonly ref: SessionRef,
    /** The session's number in troupe_sessions (a bigint, kept as its decimal text). */
    readonly sid: string,
    readonly epoch: number,
    private nextPos: number,
    readonly lane: number,
  ) {}

  append(record: string): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    const done = new Promise<void>((resolve, reject) =>
      this.appender.enqueue({ writer: this, pos: this.nextPos++, record, resolve, reject }),
    );
    this.last = done.catch(() => undefined);
    return done;
  }

  flush(): Promise<void> {
    return this.last;
  }
}

const BATCH_SQL = `
  WITH b AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[]) AS b(sid, epoch, pos, record)
  ), k AS (
    UPDATE troupe_sessions s SET update_ms = $5
      FROM (SELECT DISTINCT sid, epoch FROM b) d
     WHERE s.sid = d.sid AND s.epoch = d.epoch
    RETURNING s.sid, s.epoch
  ), i AS (
    INSERT INTO troupe_records (sid, pos, epoch, record)
    SELECT b.sid, b.pos, b.epoch, b.record FROM b JOIN k USING (sid, epoch)
  )
  SELECT sid, epoch FROM k`;

/** A writer's session and epoch, as the statement's answer names them. */
const matchKey = (sid: string, epoch: number) => `${sid}:${epoch}`;

/** One queue of appends and the statement in flight for it. */
interface Lane {
  queue: Pending[];
  writing: boolean;
}

export class PgAppender {
  private readonly lanes: Lane[];
  /** Statements written and records in them, for the benchmark and the tests. */
  readonly stats = { batches: 0, records: 0 };

  constructor(
    private readonly pool: pg.Pool,
    /**
     * Statements in flight at once. A session always uses the same lane, so its records stay in
     * order; lanes let the database work on several commits while one waits for its flush.
     */
    laneCount = 4,
    /** The most records one statement carries (the rest wait for the next). */
    private readonly maxBatch = 1000,
  ) {
    this.lanes = Array.from({ length: laneCount }, () => ({ queue: [], writing: false }));
  }

  writer(ref: SessionRef, sid: string, epoch: number, nextPos: number): SessionWriter {
    return new SessionWriter(this, ref, sid, epoch, nextPos, laneOf(ref, this.lanes.length));
  }

  /** @internal for SessionWriter. */
  enqueue(p: Pending): void {
    const lane = this.lanes[p.writer.lane];
    lane.queue.push(p);
    if (!lane.writing) void this.drain(lane);
  }

  private async drain(lane: Lane): Promise<void> {
    lane.writing = true;
    while (lane.queue.length > 0) {
      const batch = lane.queue.splice(0, this.maxBatch);
      // A writer that failed earlier in this batch's lifetime refuses its later records.
      const live = batch.filter((p) => !p.writer.failed || (p.reject(p.writer.failed), false));
      if (live.length === 0) continue;
      const sessions = new Set(live.map((p) => p.writer)).size;
      const done = appendStarted({ store: "postgres", records: live.length, sessions });
      try {
        const matched = await this.write(live);
        done();
        for (const p of live) {
          if (p.writer.failed) p.reject(p.writer.failed);
          else if (matched.has(matchKey(p.writer.sid, p.writer.epoch))) p.resolve();
          else {
            p.writer.failed = new SessionElsewhere(
              `session ${p.writer.ref.sessionId} was taken over by another runner; this runner no longer writes it`,
            );
            p.reject(p.writer.failed);
          }
        }
      } catch (err) {
        done(err);
        for (const p of live) {
          p.writer.failed ??= err;
          p.reject(p.writer.failed);
        }
      }
    }
    lane.writing = false;
  }

  /** Writes one batch; returns the keys of the sessions whose epoch matched. Retries a deadlock once. */
  private async write(batch: Pending[]): Promise<Set<string>> {
    const cols: [string[], number[], number[], string[]] = [[], [], [], []];
    for (const p of batch) {
      cols[0].push(p.writer.sid);
      cols[1].push(p.writer.epoch);
      cols[2].push(p.pos);
      cols[3].push(p.record);
    }
    for (let attempt = 0; ; attempt++) {
      try {
        const { rows } = await this.pool.query<{ sid: string; epoch: number }>(BATCH_SQL, [...cols, Date.now()]);
        this.stats.batches++;
        this.stats.records += batch.length;
        return new Set(rows.map((r) => matchKey(r.sid, r.epoch)));
      } catch (err) {
        // Two runners' batches touching the same two rows (one of them stale) can deadlock.
        if (attempt === 0 && (sqlState(err) === "40P01" || sqlState(err) === "40001")) continue;
        throw err;
      }
    }
  }
}

/** A session's lane: a hash of its ref, so every activation of it on this runner uses the same one. */
function laneOf(ref: SessionRef, lanes: number): number {
  let h = 2166136261;
  for (const part of [ref.tenant, ref.principal, ref.sessionId])
    for (let i = 0; i < part.length; i++) h = Math.imul(h ^ part.charCodeAt(i), 16777619);
  return (h >>> 0) % lanes;
}
