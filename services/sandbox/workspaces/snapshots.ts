// Snapshots: a session's workspace kept as an archive of its tenant's, to start other sessions
// from. Kept in a SnapshotStore (snapshot-stores.ts: the data directory, or a bucket), under
// `<tenant as an injective file name>/<id>`, with a record naming the tenant again, which is
// compared on every read: another tenant's snapshot is looked up under another name and answers as
// a missing one does. Every snapshot counts in its tenant's workspace quota.
import { randomUUID } from "node:crypto";
import { rm } from "node:fs/promises";
import { invalidArgumentIf, notFound } from "../../shared/errors.js";
import type { Logger } from "../../shared/process/log.js";
import { fileName } from "../../shared/session-ref.js";
import type { SnapshotStore } from "./snapshot-store.js";
import type { WorkspaceUsage } from "./workspace-usage.js";
import { snapshotDoesNotFit } from "./workspace-saves.js";
import { ArchiveTooLarge, copyWhole } from "./workspace-archive.js";

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
const nameOf = (tenant: string, id: string) => `${fileName(tenant)}/${id}`;
/** Records read at once when many are (a bucket answers each with a request). */
const READ_AT_ONCE = 16;

/** Writes a workspace's archive to `target`, at most `maxBytes` (ArchiveTooLarge past it); its size. */
export type ArchiveWriter = (target: string, maxBytes: number) => Promise<number>;

export class Snapshots {
  private loaded?: Promise<void>;

  constructor(
    private readonly store: SnapshotStore,
    private readonly usage: WorkspaceUsage,
    /** The tenant's workspaceMegabytes quota, in bytes. */
    private readonly quotaOf: (tenant: string) => number,
    private readonly logger: Logger,
  ) {}

  get where(): string {
    return this.store.where;
  }

  /**
   * Resolves once the store's snapshots are counted in their tenants' usage. Every call waits
   * for it, so no quota is judged before; a store that could not be read is tried again by the
   * next call (UNAVAILABLE until then).
   */
  ready(): Promise<void> {
    this.loaded ??= this.load().catch((err) => {
      this.loaded = undefined;
      throw err;
    });
    return this.loaded;
  }

  private async load(): Promise<void> {
    const swept = await this.store.sweep?.();
    if (swept)
      this.logger.info("removed what cut-short snapshot writes left", { files: swept, store: this.store.where });
    for (const r of await this.readAll(await this.store.names())) this.usage.set(r.tenant, item(r.id), r.bytes);
  }

  private async readAll(names: string[]): Promise<SnapshotRecord[]> {
    const out: SnapshotRecord[] = [];
    for (let i = 0; i < names.length; i += READ_AT_ONCE) {
      const batch = names.slice(i, i + READ_AT_ONCE);
      const records = await Promise.all(batch.map((n) => this.store.readRecord<SnapshotRecord>(n)));
      // A record is the tenant's only under the tenant's own name.
      records.forEach((r, j) => {
        if (r && batch[j] === nameOf(r.tenant, r.id)) out.push(r);
      });
    }
    return out;
  }

  /** The tenant's snapshot; NOT_FOUND when it has none of that id (another tenant's included). */
  async get(tenant: string, id: string): Promise<SnapshotRecord> {
    invalidArgumentIf(!SNAPSHOT_ID.test(id), "snapshot_id is missing or malformed");
    await this.ready();
    const r = await this.store.readRecord<SnapshotRecord>(nameOf(tenant, id));
    if (r?.tenant !== tenant || r.id !== id) throw notFound(`no snapshot ${id}`);
    return r;
  }

  /** A local file with the snapshot's archive; NOT_FOUND when the store lost it. */
  async archiveOf(r: SnapshotRecord): Promise<string> {
    const file = await this.store.archive(nameOf(r.tenant, r.id));
    if (!file) throw notFound(`snapshot ${r.id} has no archive in ${this.store.where}`);
    return file;
  }

  /** The tenant's snapshots, newest first. */
  async list(tenant: string): Promise<SnapshotRecord[]> {
    await this.ready();
    const records = await this.readAll(await this.store.names(fileName(tenant)));
    return records
      .filter((r) => r.tenant === tenant)
      .sort((a, b) => b.createdAt - a.createdAt || (a.id < b.id ? -1 : 1));
  }

  /**
   * A new snapshot of the tenant, its archive written by `write` within the tenant's room;
   * RESOURCE_EXHAUSTED when it would not fit.
   */
  async create(tenant: string, sourceSessionId: string, name: string, write: ArchiveWriter): Promise<SnapshotRecord> {
    await this.ready();
    const limit = this.quotaOf(tenant);
    const room = this.usage.room(tenant, limit);
    if (room === 0) throw snapshotDoesNotFit(tenant, room, limit);
    const id = `snap-${randomUUID()}`;
    const at = nameOf(tenant, id);
    const staged = await this.store.staging(at);
    let bytes: number;
    try {
      bytes = await write(staged, room);
    } catch (err) {
      await rm(staged, { force: true });
      throw err instanceof ArchiveTooLarge ? snapshotDoesNotFit(tenant, room, limit) : err;
    }
    await this.store.putArchive(at, staged, bytes);
    const record: SnapshotRecord = { id, tenant, name, sourceSessionId, createdAt: Date.now(), bytes };
    await this.store.putRecord(at, record);
    this.usage.set(tenant, item(id), bytes);
    this.logger.info("made a snapshot", { tenant, snapshot: id, bytes, store: this.store.where });
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
    await this.get(tenant, id);
    await this.store.remove(nameOf(tenant, id));
    this.usage.delete(tenant, item(id));
    this.logger.info("deleted a snapshot", { tenant, snapshot: id });
  }
}
