// The PostgreSQL store's smaller parts: schedules, owners' profiles and the audit log, each the
// same contract as its file counterpart (schedule-files.ts, profile-store.ts, audit-log.ts).
import type pg from "pg";
import { sameRef, type SessionRef } from "../../shared/session-ref.js";
import type { AuditQuery, AuditRecord, AuditSink, StoredAudit } from "./audit-log.js";
import type { FileRead } from "../loop/context-file.js";
import { profileRead, type ProfileOwner, type ProfileStore } from "./profile-store.js";
import { parseScheduleFile, refOfFile, type ScheduleFile, type ScheduleStore } from "./schedule-files.js";

const KEY = "tenant = $1 AND principal = $2 AND session_id = $3";

/** A row's schedules, or none when the body is damaged or names another session than the row's key. */
function fileOfRow(ref: SessionRef, body: unknown): ScheduleFile | undefined {
  const f = parseScheduleFile(JSON.stringify(body));
  return f && sameRef(refOfFile(f), ref) ? f : undefined;
}

/** Each session's schedules as one row, keyed by the session's ref (a row cannot speak for another). */
export class PgScheduleStore implements ScheduleStore {
  constructor(private readonly pool: pg.Pool) {}

  async read(ref: SessionRef): Promise<ScheduleFile | undefined> {
    const { rows } = await this.pool.query<{ body: unknown }>(`SELECT body FROM troupe_schedules WHERE ${KEY}`, [
      ref.tenant,
      ref.principal,
      ref.sessionId,
    ]);
    return rows[0] ? fileOfRow(ref, rows[0].body) : undefined;
  }

  async all(): Promise<ScheduleFile[]> {
    const { rows } = await this.pool.query<{ body: unknown; tenant: string; principal: string; session_id: string }>(
      "SELECT tenant, principal, session_id, body FROM troupe_schedules",
    );
    return rows.flatMap((r) => {
      const f = fileOfRow({ tenant: r.tenant, principal: r.principal, sessionId: r.session_id }, r.body);
      return f ? [f] : [];
    });
  }

  async write(ref: SessionRef, file: ScheduleFile | undefined): Promise<void> {
    const key = [ref.tenant, ref.principal, ref.sessionId];
    if (!file) return void (await this.pool.query(`DELETE FROM troupe_schedules WHERE ${KEY}`, key));
    await this.pool.query(
      `INSERT INTO troupe_schedules (tenant, principal, session_id, body) VALUES ($1, $2, $3, $4)
       ON CONFLICT (tenant, principal, session_id) DO UPDATE SET body = excluded.body`,
      [...key, JSON.stringify(file)],
    );
  }
}

/** Profiles as rows; the first read makes one from the template (two at once make it once). */
export class PgProfileStore implements ProfileStore {
  constructor(private readonly pool: pg.Pool) {}

  async read(owner: ProfileOwner, template: string, limit: number): Promise<FileRead> {
    const key = [owner.agentId, owner.tenant, owner.principal];
    await this.pool.query(
      `INSERT INTO troupe_profiles (agent_id, tenant, principal, body) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
      [...key, template],
    );
    const { rows } = await this.pool.query<{ body: string }>(
      "SELECT body FROM troupe_profiles WHERE agent_id = $1 AND tenant = $2 AND principal = $3",
      key,
    );
    return profileRead(owner, rows[0]?.body ?? template, limit);
  }
}

/** The audit log as rows, each committed before its promise resolves; every runner writes to one log. */
export class PgAuditLog implements AuditSink {
  readonly shared = true;
  private readonly pending = new Set<Promise<unknown>>();

  constructor(
    private readonly pool: pg.Pool,
    private readonly runnerId: string,
  ) {}

  record(rec: AuditRecord): Promise<void> {
    const write = this.pool
      .query("INSERT INTO troupe_audit (runner_id, record) VALUES ($1, $2)", [this.runnerId, JSON.stringify(rec)])
      .then(() => undefined);
    this.pending.add(write);
    void write.catch(() => undefined).finally(() => this.pending.delete(write));
    return write;
  }

  async read(query: AuditQuery): Promise<StoredAudit[]> {
    const { rows } = await this.pool.query<{ at: Date; runner_id: string; record: AuditRecord }>(
      `SELECT at, runner_id, record FROM troupe_audit
        WHERE ($1 = '' OR record->>'tenant' = $1) AND ($2 = '' OR record->>'sessionId' = $2)
        ORDER BY id DESC LIMIT $3`,
      [query.tenant ?? "", query.sessionId ?? "", query.limit],
    );
    return rows.map((r) => ({ timeMs: r.at.getTime(), runnerId: r.runner_id, record: r.record }));
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.pending]);
  }
}
