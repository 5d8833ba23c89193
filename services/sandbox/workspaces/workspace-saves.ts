// Workspaces that outlive their containers. A sandbox's /workspace stays what it was, a tmpfs with
// the same mount options and size bound, under the same user, seccomp filter and limits on runc
// and runsc; what is added is a save: after a burst of work (SAVE_AFTER_MS without a command) the
// workspace is archived (workspace-archive.ts) into the service's data directory. When the key
// next gets a sandbox (after an idle reap, the maximum age, a crash of the container or of the
// engine) the archive is unpacked into it, and the first command is told so.
//
// A save is of one key only, under a name made of its key's hash, and counts in its tenant's
// workspace quota: a save that would not fit is not kept (the last one is removed, as it is stale)
// and the session's next command is told. Release (DeleteSession, retention) removes it.
import { createHash } from "node:crypto";
import { mkdir, readdir, rm, stat } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../../shared/process/log.js";
import type { AgentConnection } from "../agent-connection.js";
import { resourceExhausted, type RpcError } from "../../shared/errors.js";
import {
  ArchiveTooLarge,
  archiveCap,
  archiveWorkspace,
  copyWhole,
  readRecord,
  unpackWorkspace,
  writeRecord,
} from "./workspace-archive.js";
import type { WorkspaceUsage } from "./workspace-usage.js";

/** A workspace is saved once this long has passed without a command in its sandbox. */
export const SAVE_AFTER_MS = 5_000;

export interface SaveInfo {
  savedAt: number;
  bytes: number;
  /** Commands that were running in the sandbox when it was saved (they do not come back). */
  running: number;
  /** Their command lines (the first STOPPED_LISTED, each cut at STOPPED_CHARS). */
  stopped?: string[];
  /** What the save was made from when not from the key's own sandbox (a snapshot). */
  from?: string;
  /** Why the workspace of `savedAt` was not kept (over its tenant's quota: overQuota); no archive then. */
  refused?: string;
}

/** A sandbox as its workspace's keeping sees it (fleet.ts's Sandbox is one). */
export interface KeptWorkspace {
  readonly key: string;
  readonly agent: AgentConnection;
  /** The tenant the workspace counts for, named by the calls that used it. */
  tenant?: string;
  /** What the next command is told of its workspace (restored, not restored, not saved). */
  note?: string;
  /** Work happened since the workspace's last save. */
  unsaved?: boolean;
  saveTimer?: NodeJS.Timeout;
  /** The save under way, which a release waits for before removing the save. */
  saving?: Promise<void>;
}

const MIB = 1024 * 1024;
const STOPPED_LISTED = 10;
const STOPPED_CHARS = 200;

/** What a restored workspace's first command is told of the commands its save found running. */
function stoppedNote({ running, stopped = [] }: SaveInfo): string {
  if (running === 0) return "; processes from before are not running";
  const listed = stopped.map((c) => JSON.stringify(c)).join(", ");
  const more = running > stopped.length ? ` and ${running - stopped.length} more` : "";
  return `; ${running} command(s) running then (background processes) were stopped and are not running now${listed ? `: ${listed}${more}` : ""}`;
}

/** What the sandbox's next command is told of its workspace (restored, from a template, not saved), once. */
export function takeNote(w: KeptWorkspace): string {
  const note = w.note ?? "";
  w.note = undefined;
  return note;
}

/** Why an archive was refused: the tenant's room left under its quota. */
export const overQuota = (tenant: string, room: number, limit: number): string =>
  `it is larger than the ${(room / MIB).toFixed(1)} MiB left of tenant ${tenant}'s workspace quota ` +
  `(${Math.floor(limit / MIB)} MiB for saved workspaces and snapshots)`;
/** A snapshot (made, or restored as a save) that does not fit its tenant's room: RESOURCE_EXHAUSTED. */
export const snapshotDoesNotFit = (tenant: string, room: number, limit: number): RpcError =>
  resourceExhausted(
    `this snapshot does not fit: ${overQuota(tenant, room, limit)}; delete snapshots or sessions first`,
  );
const item = (key: string) => `save:${key}`;

export class WorkspaceSaves {
  constructor(
    private readonly dir: string,
    /** A workspace's size bound: no save is larger (the archive's headers aside). */
    private readonly maxBytes: number,
    private readonly logger: Logger,
    private readonly usage: WorkspaceUsage,
    /** The tenant's workspaceMegabytes quota, in bytes. */
    private readonly quotaOf: (tenant: string) => number,
  ) {}

  /** Counts the saves on disk in their tenants' usage; call once before serving. */
  async load(): Promise<void> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    for (const name of names.filter((n) => n.endsWith(".tar.json"))) {
      const meta = await this.meta(path.join(this.dir, name));
      if (meta?.tenant && !meta.refused) this.usage.set(meta.tenant, item(meta.key), meta.bytes);
    }
  }

  private file(key: string): string {
    return path.join(this.dir, `${createHash("sha256").update(key).digest("hex").slice(0, 40)}.tar`);
  }

  private meta(file: string): Promise<(SaveInfo & { key: string; tenant?: string }) | undefined> {
    return readRecord(file);
  }

  /** The key's save (or the note of a refused one); undefined when it has none. */
  async info(key: string): Promise<SaveInfo | undefined> {
    const m = await this.meta(`${this.file(key)}.json`);
    if (m?.key !== key) return undefined;
    const { savedAt, bytes, running = 0, stopped, from, refused } = m;
    return { savedAt, bytes, running, stopped, from, refused };
  }

  private async record(key: string, tenant: string | undefined, info: SaveInfo): Promise<void> {
    await writeRecord(`${this.file(key)}.json`, { key, tenant, ...info });
    if (tenant && !info.refused) this.usage.set(tenant, item(key), info.bytes);
    else if (tenant) this.usage.delete(tenant, item(key));
  }

  /** The archive file of the key's save, when it has one (snapshots copy it). */
  async archiveOf(key: string): Promise<{ file: string; info: SaveInfo } | undefined> {
    const info = await this.info(key);
    const file = info && (await this.archiveFile(key, info));
    return file ? { file, info: info! } : undefined;
  }

  /** The archive of a save whose record is `info`; undefined for a refused one, or one whose archive is gone. */
  private async archiveFile(key: string, info: SaveInfo): Promise<string | undefined> {
    if (info.refused) return undefined;
    const file = this.file(key);
    return (await stat(file).catch(() => undefined)) ? file : undefined;
  }

  /** Work was done in the sandbox: its workspace is saved once SAVE_AFTER_MS pass without more. */
  used(w: KeptWorkspace, tenant: string): void {
    if (w.key === "") return;
    w.tenant = tenant;
    w.unsaved = true;
    clearTimeout(w.saveTimer);
    w.saveTimer = setTimeout(() => void this.saveNow(w), SAVE_AFTER_MS);
    w.saveTimer.unref();
  }

  /** Saves the sandbox's workspace if work was done since its last save. */
  async saveNow(w: KeptWorkspace): Promise<void> {
    clearTimeout(w.saveTimer);
    await w.saving;
    if (!w.unsaved || !w.agent.alive) return;
    w.unsaved = false;
    w.saving = this.save(w).catch((err: unknown) => {
      w.unsaved = true;
      this.logger.warn("could not save a workspace", { scope: w.key, error: (err as Error).message });
    });
    await w.saving;
    w.saving = undefined;
  }

  /** Archives the workspace as the key's save, within its tenant's room. */
  private async save(w: KeptWorkspace): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    const limit = w.tenant ? this.quotaOf(w.tenant) : Number.POSITIVE_INFINITY;
    const room = w.tenant ? this.usage.room(w.tenant, limit, item(w.key)) : Number.POSITIVE_INFINITY;
    const cap = archiveCap(this.maxBytes);
    // Taken before tar runs, which is a command too.
    const lines = w.agent.runningCommandLines;
    const running = lines.length;
    const stopped = lines
      .slice(0, STOPPED_LISTED)
      .map((c) => (c.length > STOPPED_CHARS ? `${c.slice(0, STOPPED_CHARS)}…` : c));
    const started = Date.now();
    try {
      const bytes = await archiveWorkspace(w.agent, this.file(w.key), Math.min(cap, room));
      await this.record(w.key, w.tenant, { savedAt: Date.now(), bytes, running, stopped });
      this.logger.debug("saved a workspace", { scope: w.key, bytes, ms: Date.now() - started });
    } catch (err) {
      if (!(err instanceof ArchiveTooLarge) || room >= cap) throw err;
      const refused = overQuota(w.tenant!, room, limit);
      await rm(this.file(w.key), { force: true });
      await this.record(w.key, w.tenant, { savedAt: Date.now(), bytes: 0, running, refused });
      w.note = `/workspace was not saved: ${refused}. These files are lost when this sandbox is reaped unless room is made (fewer files here, or snapshots and sessions deleted).`;
      this.logger.warn("a workspace save was over its tenant's quota", { scope: w.key, tenant: w.tenant });
    }
  }

  /**
   * Unpacks the key's save into its new sandbox, and notes for its next command what came of it;
   * false when the key has no save (nor the record of one refused).
   */
  async restoreInto(w: KeptWorkspace): Promise<boolean> {
    try {
      const info = await this.info(w.key);
      if (!info) return false;
      const when = new Date(info.savedAt).toISOString();
      if (info.refused) {
        w.note = `this sandbox is new and /workspace starts empty: its files of ${when} were not kept (${info.refused})`;
        return true;
      }
      const file = await this.archiveFile(w.key, info);
      if (!file) return false;
      const started = Date.now();
      await unpackWorkspace(w.agent, file);
      this.logger.debug("restored a workspace", { scope: w.key, bytes: info.bytes, ms: Date.now() - started });
      w.note = info.from
        ? `this sandbox is new: /workspace was restored from ${info.from}`
        : `this sandbox is new: /workspace was restored from its save of ${when}${stoppedNote(info)}`;
      return true;
    } catch (err) {
      this.logger.warn("could not restore a saved workspace", { scope: w.key, error: (err as Error).message });
      w.note = `this sandbox is new and /workspace could not be restored from its save (${(err as Error).message}): it starts empty`;
      return true;
    }
  }

  /**
   * Makes `archive` (a snapshot's, of `bytes`) the key's save, counted for `tenant`;
   * RESOURCE_EXHAUSTED when it would not fit the tenant's quota (nothing changed then).
   */
  async adopt(key: string, tenant: string, archive: string, bytes: number, from: string): Promise<void> {
    const limit = this.quotaOf(tenant);
    const room = this.usage.room(tenant, limit, item(key));
    if (room < bytes) throw snapshotDoesNotFit(tenant, room, limit);
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    await copyWhole(archive, this.file(key));
    await this.record(key, tenant, { savedAt: Date.now(), bytes, running: 0, from });
  }

  /** Removes the key's save; whether it had one. */
  async remove(key: string): Promise<boolean> {
    const m = await this.meta(`${this.file(key)}.json`);
    const had = m?.key === key;
    await Promise.all([rm(this.file(key), { force: true }), rm(`${this.file(key)}.json`, { force: true })]);
    if (had && m.tenant) this.usage.delete(m.tenant, item(key));
    if (had) this.logger.info("removed a saved workspace", { scope: key });
    return had;
  }
}
