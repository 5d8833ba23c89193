// Snapshots: a session's workspace kept as an archive of its tenant's, to start other sessions
// from. Stored in the service's data directory, one folder per tenant (named injectively from the
// tenant, session-ref.ts), `<id>.tar` with `<id>.json` beside it naming the tenant again, which is
// compared on every read: another tenant's snapshot is looked up in another folder and answers as
// a missing one does. Every snapshot counts in its tenant's workspace quota.
import { randomUUID } from "node:crypto";
import { mkdir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import { invalidArgumentIf, notFound } from "../../shared/errors.js";
import type { Logger } from "../../shared/process/log.js";
import { fileName } from "../../shared/session-ref.js";
import type { WorkspaceUsage } from "./workspace-usage.js";
import { snapshotDoesNotFit } from "./workspace-saves.js";
import { ArchiveTooLarge, copyWhole, readRecord, writeRecord } from "./workspace-archive.js";

export interface SnapshotRecord {
  id: string;
  tenant: string;
  name: string;
  sourceSessionId: string;
  createdAt: number;
  bytes: number;
}

const SNAPSHOT_ID = /^snap-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
export const isSnapshotId = (id: string): boolean => SNAPSHOT_ID.test(id);
const item = (id: string) => `snapshot:${id}`;

/** Writes a workspace's archive to `target`, at most `maxBytes` (ArchiveTooLarge past it); its size. */
export type ArchiveWriter = (target: string, maxBytes: number) => Promise<number>;

export class Snapshots {
  constructor(
    private readonly dir: string,
    private readonly usage: WorkspaceUsage,
    /** The tenant's workspaceMegabytes quota, in bytes. */
    private readonly quotaOf: (tenant: string) => number,
    private readonly logger: Logger,
  ) {}

  /** Counts the snapshots on disk in their tenants' usage; call once before serving. */
  async load(): Promise<void> {
    for (const folder of await readdir(this.dir).catch(() => [] as string[]))
      for (const name of await readdir(path.join(this.dir, folder)).catch(() => [] as string[])) {
        if (!name.endsWith(".json")) continue;
        const r = await this.read(path.join(this.dir, folder, name));
        if (r) this.usage.set(r.tenant, item(r.id), r.bytes);
      }
  }

  private folder(tenant: string): string {
    return path.join(this.dir, fileName(tenant));
  }

  private read(file: string): Promise<SnapshotRecord | undefined> {
    return readRecord<SnapshotRecord>(file);
  }

  /** The tenant's snapshot; NOT_FOUND when it has none of that id (another tenant's included). */
  async get(tenant: string, id: string): Promise<SnapshotRecord & { file: string }> {
    invalidArgumentIf(!SNAPSHOT_ID.test(id), "snapshot_id is missing or malformed");
    const base = path.join(this.folder(tenant), id);
    const r = await this.read(`${base}.json`);
    if (r?.tenant !== tenant || r.id !== id) throw notFound(`no snapshot ${id}`);
    return { ...r, file: `${base}.tar` };
  }

  /** The tenant's snapshots, newest first. */
  async list(tenant: string): Promise<SnapshotRecord[]> {
    const folder = this.folder(tenant);
    const names = await readdir(folder).catch(() => [] as string[]);
    const records = await Promise.all(
      names.filter((n) => n.endsWith(".json")).map((n) => this.read(path.join(folder, n))),
    );
    return records
      .filter((r): r is SnapshotRecord => r?.tenant === tenant)
      .sort((a, b) => b.createdAt - a.createdAt || (a.id < b.id ? -1 : 1));
  }

  /**
   * A new snapshot of the tenant, its archive written by `write` within the tenant's room;
   * RESOURCE_EXHAUSTED when it would not fit.
   */
  async create(tenant: string, sourceSessionId: string, name: string, write: ArchiveWriter): Promise<SnapshotRecord> {
    const limit = this.quotaOf(tenant);
    const room = this.usage.room(tenant, limit);
    if (room === 0) throw snapshotDoesNotFit(tenant, room, limit);
    const id = `snap-${randomUUID()}`;
    const folder = this.folder(tenant);
    await mkdir(folder, { recursive: true, mode: 0o700 });
    const base = path.join(folder, id);
    let bytes: number;
    try {
      bytes = await write(`${base}.tar`, room);
    } catch (err) {
      throw err instanceof ArchiveTooLarge ? snapshotDoesNotFit(tenant, room, limit) : err;
    }
    const record: SnapshotRecord = { id, tenant, name, sourceSessionId, createdAt: Date.now(), bytes };
    await writeRecord(`${base}.json`, record);
    this.usage.set(tenant, item(id), bytes);
    this.logger.info("made a snapshot", { tenant, snapshot: id, bytes });
    return record;
  }

  /** Copies an archive file (a save) as a snapshot archive: an ArchiveWriter. */
  static copying(source: string, bytes: number): ArchiveWriter {
    return async (target, maxBytes) => {
      if (bytes > maxBytes) throw new ArchiveTooLarge(`the save's archive is over ${maxBytes} bytes`);
      await copyWhole(source, target);
      return bytes;
    };
  }

  /** Deletes the tenant's snapshot; NOT_FOUND as get. */
  async delete(tenant: string, id: string): Promise<void> {
    const r = await this.get(tenant, id);
    await rm(`${path.join(this.folder(tenant), id)}.json`, { force: true });
    await rm(r.file, { force: true });
    this.usage.delete(tenant, item(id));
    this.logger.info("deleted a snapshot", { tenant, snapshot: id });
  }
}
