// The durable record of a session: one append-only JSONL file per session, at
// <data-dir>/sessions/<tenant>/<principal>/<session>.jsonl (each part encoded by filePart, so no two
// owners' ids meet in one file; the header keeps the raw ids and is compared on every read). Every accepted client frame and every complete event is appended in seq
// order; a record that was acknowledged was fsynced first. Token deltas are not kept (the complete
// message that follows them is). Anything that can append and replay records can replace it.
import { randomUUID } from "node:crypto";
import { mkdir, open, readFile, readdir, rm, stat, type FileHandle } from "node:fs/promises";
import { migrateFlatLogs } from "./flat-logs.js";
import path from "node:path";
import { DEV_IDENTITY, type Identity } from "../shared/auth.js";
import { createExclusive, syncDir } from "../shared/exclusive-file.js";
import { filePart, refOf, type SessionRef } from "../shared/session-ref.js";
import { SessionElsewhere, SessionLeases, type Lease, type Owner } from "./session-lease.js";
import { appendStarted } from "./append-telemetry.js";

/** One line of the log. Frames and events are stored in protobuf JSON form. */
export type LogRecord =
  // The header. tenant and principal own the session; logs written before authentication existed
  // have neither and belong to the local development identity (LEGACY_OWNER).
  | {
      t: "session";
      sessionId: string;
      agentId: string;
      createdMs: number;
      tenant?: string;
      principal?: string;
      memoryOwner?: string;
      subagent?: Subagent;
    }
  // A runner took the session (see session-lease.ts); records of older epochs after it are void.
  | { t: "epoch"; epoch: number; runnerId: string }
  | { t: "frame"; frame: unknown }
  // The session's default queue mode, model or reasoning effort changed, or its conversation was
  // reset to start at message `contextFrom` (each only when set).
  | { t: "settings"; queueMode?: number; model?: string; reasoningEffort?: string; contextFrom?: number }
  | { t: "event"; event: unknown }
  // seq values up to `upTo` may have been handed out; a restart continues after it.
  | { t: "seq"; upTo: number }
  // The actor left memory cleanly with `seq` as its last seq: nothing was handed out beyond it.
  | { t: "closed"; seq: number }
  // These messages leave the history (a heartbeat that found nothing to say); their events stay.
  | { t: "elided"; messageIds: string[] };

/** A sub-agent's session (delegate_task): whose child it is, how deep, and its task instruction. */
export interface Subagent {
  parentSessionId: string;
  depth: number;
  instruction: string;
}

export interface SessionLog {
  /**
   * Appends a record; with `sync`, resolves once it is on disk. Rejects with SessionElsewhere
   * once another runner has taken the session: nothing more is acknowledged here.
   */
  append(record: LogRecord, sync?: boolean): Promise<void>;
  /** Resolves once everything appended so far is written. */
  flush(): Promise<void>;
  /** Flushes, then gives the session up (its lease) for the next activation anywhere. */
  close(): Promise<void>;
}

/**
 * Who a session belongs to (only they may use it), and whose memories its runs recall when that
 * is not the principal itself (a channel sender; memoryOwner).
 */
export interface SessionOwner extends Identity {
  memoryOwner?: string;
}

/** Who owns a session whose log predates ownership: the development key's identity. */
export const LEGACY_OWNER: SessionOwner = DEV_IDENTITY;

export function ownerOf(head: Extract<LogRecord, { t: "session" }>): SessionOwner {
  if (!head.tenant || !head.principal) return LEGACY_OWNER;
  return head.memoryOwner
    ? { tenant: head.tenant, principal: head.principal, memoryOwner: head.memoryOwner }
    : { tenant: head.tenant, principal: head.principal };
}

/** The first record of every session log, in any store: who owns it and what it runs. */
export function sessionHeader(ref: SessionRef, agentId: string, owner: SessionOwner, subagent?: Subagent): LogRecord {
  return {
    t: "session",
    sessionId: ref.sessionId,
    agentId,
    createdMs: Date.now(),
    tenant: ref.tenant,
    principal: ref.principal,
    ...(owner.memoryOwner ? { memoryOwner: owner.memoryOwner } : {}),
    ...(subagent ? { subagent } : {}),
  };
}

export interface StoredSession {
  sessionId: string;
  agentId: string;
  owner: Identity;
  createdMs: number;
  updateMs: number;
}

/** Sessions are addressed by ref (owner and id): the same id of two owners is two sessions. */
export interface SessionStore {
  exists(ref: SessionRef): Promise<boolean>;
  /**
   * A new session, owned by this runner, its log holding the header and then `opening`, written
   * atomically. Fails with EEXIST if the session exists. The owner is the ref's.
   */
  create(
    ref: SessionRef,
    agentId: string,
    owner: SessionOwner,
    subagent?: Subagent,
    opening?: LogRecord[],
  ): Promise<SessionLog>;
  /**
   * Takes a stored session for this runner: its log to append to, its records so far, and the
   * lines of the log that were damaged and skipped (the actor reports them).
   */
  activate(ref: SessionRef): Promise<{ log: SessionLog; records: LogRecord[]; corruptLines: number[] }>;
  /** The session's valid records (a stale owner's late writes left out). */
  read(ref: SessionRef): Promise<LogRecord[]>;
  /** One principal's sessions; without `owner`, everyone's (retention sweeps). */
  list(owner?: Identity): Promise<StoredSession[]>;
  /** Deletes the session's log for good; false when there was none. Call with no activation of it open. */
  remove(ref: SessionRef): Promise<boolean>;
}

/** One line of the log; records written by an owner carry its epoch (the header has none). */
function logLine(record: LogRecord, epoch?: number): string {
  const json = JSON.stringify(record);
  return epoch === undefined ? `${json}\n` : `{"e":${epoch},${json.slice(1)}\n`;
}

/** An idle log closes its file after this long and reopens it on the next append. */
const IDLE_CLOSE_MS = 2000;

/**
 * Group commit: records appended while a write is in flight are written together by the next one,
 * and fsynced once if any of them asked for it. Order is append order; a promise resolves when
 * its record is written (and synced, if asked). After a failed write every later append fails:
 * nothing is acknowledged past a hole in the log. Each line carries the writer's epoch, and every
 * sync checks that the lease still holds.
 */
class JsonlSessionLog implements SessionLog {
  private batch: string[] = [];
  private batchSync = false;
  private waiters: { resolve(): void; reject(err: unknown): void }[] = [];
  private writing?: Promise<void>;
  private failed?: unknown;
  private dirty = false;
  private fh?: FileHandle;
  private idleTimer?: NodeJS.Timeout;

  constructor(
    private readonly sessionId: string,
    private readonly file: string,
    private readonly lease: Lease,
    private readonly leases: SessionLeases,
  ) {}

  append(record: LogRecord, sync = false): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    this.batch.push(logLine(record, this.lease.epoch));
    this.batchSync ||= sync;
    const done = new Promise<void>((resolve, reject) => this.waiters.push({ resolve, reject }));
    this.writing ??= this.drain();
    return done;
  }

  async flush(): Promise<void> {
    await this.writing;
  }

  private async drain(): Promise<void> {
    clearTimeout(this.idleTimer);
    while (this.batch.length > 0) {
      const data = this.batch.join("");
      const sync = this.batchSync;
      const waiters = this.waiters;
      this.batch = [];
      this.batchSync = false;
      this.waiters = [];
      const done = appendStarted({ store: "files", records: waiters.length, sessions: 1, sync });
      try {
        const bytes = Buffer.from(data, "utf8");
        // The file is opened for appending, so each write lands at the end; loop on short writes.
        const fh = (this.fh ??= await open(this.file, "a"));
        for (let off = 0; off < bytes.length; ) off += (await fh.write(bytes, off)).bytesWritten;
        if (sync) {
          await fh.datasync();
          // Checked after the sync: a lease still held now was held when the record landed, so
          // the record precedes any new owner's epoch record and counts.
          if (!(await this.leases.holds(this.lease)))
            throw new SessionElsewhere(
              `session ${this.sessionId} was taken over by another runner; this runner no longer writes it`,
            );
        }
        this.dirty = !sync;
        done();
        for (const w of waiters) w.resolve();
      } catch (err) {
        done(err);
        this.failed = err;
        for (const w of [...waiters, ...this.waiters]) w.reject(err);
        this.waiters = [];
        this.batch = [];
      }
    }
    this.writing = undefined;
    // Thousands of idle sessions should not hold thousands of open files.
    if (!this.dirty && this.fh) {
      this.idleTimer = setTimeout(() => {
        if (this.writing || this.dirty || !this.fh) return;
        const fh = this.fh;
        this.fh = undefined;
        fh.close().catch(() => undefined);
      }, IDLE_CLOSE_MS);
      this.idleTimer.unref();
    }
  }

  async close(): Promise<void> {
    clearTimeout(this.idleTimer);
    await this.writing;
    if (this.dirty && !this.failed) await this.fh?.datasync().catch(() => undefined);
    await this.fh?.close().catch(() => undefined);
    this.fh = undefined;
    // Released after a failed write too: the next activation cuts a torn tail before it appends,
    // and a damaged line in the middle is skipped by readers.
    await this.leases.release(this.lease);
  }
}

/** A log's valid records, and the lines that did not parse (1-based; a torn last line is not one). */
export interface ParsedLog {
  records: LogRecord[];
  corruptLines: number[];
}

/**
 * Parses a log's text. Only the last line can be torn by a crash (never acknowledged); a line in
 * the middle that does not parse (a damaged disk, a hand edit) is skipped and reported, so one bad
 * record costs that record, not the session. Records stamped with an epoch older than the latest
 * epoch record before them were written by an owner that had already lost the session: left out.
 */
export function parseLog(text: string): ParsedLog {
  const records: LogRecord[] = [];
  const corruptLines: number[] = [];
  const lines = text.split("\n");
  let current = 0;
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] === "") continue;
    let rec: LogRecord & { e?: number };
    try {
      rec = JSON.parse(lines[i]) as LogRecord & { e?: number };
      if (typeof rec !== "object" || rec === null || typeof rec.t !== "string") throw new Error("not a record");
    } catch {
      if (i < lines.length - 2) corruptLines.push(i + 1);
      continue;
    }
    if (rec.t === "epoch") current = Math.max(current, rec.epoch);
    else if (rec.e !== undefined && rec.e < current) continue;
    delete rec.e;
    records.push(rec);
  }
  return { records, corruptLines };
}

/** Whether a log's header names this session of this owner (a foreign or legacy-misplaced file does not count). */
function headerMatches(records: LogRecord[], ref: SessionRef): boolean {
  const head = records[0];
  if (head?.t !== "session") return false;
  const owner = ownerOf(head);
  return head.sessionId === ref.sessionId && owner.tenant === ref.tenant && owner.principal === ref.principal;
}

/** Where a data directory keeps a session's log (for operators and tests; the store uses the same). */
export const sessionLogPath = (dataDir: string, ref: SessionRef): string =>
  path.join(dataDir, "sessions", filePart(ref.tenant), filePart(ref.principal), `${filePart(ref.sessionId)}.jsonl`);

const notThere = (ref: SessionRef) =>
  Object.assign(new Error(`session ${ref.sessionId} does not exist`), { code: "ENOENT" });

export class JsonlSessionStore implements SessionStore {
  private readonly dir: string;
  readonly leases: SessionLeases;

  /**
   * `owner` is the runner process that will write through this store; by default an anonymous
   * one (fine for a single runner, and for tools that only read).
   */
  constructor(dataDir: string, owner?: Owner, livenessMs?: number) {
    this.dir = path.join(dataDir, "sessions");
    this.leases = new SessionLeases(
      this.dir,
      owner ?? { runnerId: `local-${process.pid}`, address: "", incarnation: randomUUID() },
      livenessMs,
    );
  }

  /** Starts the runner's heartbeat: other runners treat this runner's sessions as live from now. */
  async start(): Promise<void> {
    await this.leases.start();
    await migrateFlatLogs(
      this.dir,
      (ref) => this.file(ref),
      (line) => {
        const head = parseLog(line).records[0];
        return head?.t === "session" ? refOf(ownerOf(head), head.sessionId) : undefined;
      },
    );
  }

  /** Stops the heartbeat; call after every log is closed. */
  stop(): Promise<void> {
    return this.leases.stop();
  }

  private ownerDir(owner: Identity): string {
    return path.join(this.dir, filePart(owner.tenant), filePart(owner.principal));
  }

  /** The log's path without its extension; lease files sit beside it. */
  private base(ref: SessionRef): string {
    return path.join(this.ownerDir(ref), filePart(ref.sessionId));
  }

  private file(ref: SessionRef): string {
    return `${this.base(ref)}.jsonl`;
  }

  async remove(ref: SessionRef): Promise<boolean> {
    if (!(await this.exists(ref))) return false;
    await rm(this.file(ref), { force: true });
    // Its lease files go too: a session made later under the same id starts from epoch 1.
    const prefix = `${filePart(ref.sessionId)}.lease.`;
    for (const name of await readdir(this.ownerDir(ref)).catch(() => [] as string[]))
      if (name.startsWith(prefix)) await rm(path.join(this.ownerDir(ref), name), { force: true });
    return true;
  }

  async exists(ref: SessionRef): Promise<boolean> {
    try {
      // The header is compared too: a name reached by hash (a very long id) must hold this id.
      const fh = await open(this.file(ref), "r");
      try {
        const { bytesRead, buffer } = await fh.read(Buffer.alloc(4096), 0, 4096, 0);
        return headerMatches(parseLog(buffer.subarray(0, bytesRead).toString("utf8").split("\n")[0]).records, ref);
      } finally {
        await fh.close();
      }
    } catch {
      return false;
    }
  }

  /**
   * Creates the log with its header atomically: the header, the first epoch and the opening
   * records are written and fsynced to a temporary file that is then linked into place. A crash
   * leaves either no log or all of them, and link() fails with EEXIST if someone else created the
   * session first.
   */
  async create(
    ref: SessionRef,
    agentId: string,
    owner: SessionOwner,
    subagent?: Subagent,
    opening: LogRecord[] = [],
  ): Promise<SessionLog> {
    const dir = this.ownerDir(ref);
    await mkdir(dir, { recursive: true });
    const final = this.file(ref);
    if (
      await stat(final).then(
        () => true,
        () => false,
      )
    )
      throw Object.assign(new Error(`session ${ref.sessionId} exists`), { code: "EEXIST" });
    const lease = await this.leases.acquire(this.base(ref), ref.sessionId, 0);
    const header = sessionHeader(ref, agentId, owner, subagent);
    const epoch: LogRecord = { t: "epoch", epoch: lease.epoch, runnerId: this.leases.self.runnerId };
    try {
      if (
        !(await createExclusive(
          final,
          [logLine(header), ...[epoch, ...opening].map((r) => logLine(r, lease.epoch))].join(""),
        ))
      ) {
        throw Object.assign(new Error(`session ${ref.sessionId} exists`), { code: "EEXIST" });
      }
    } catch (err) {
      await this.leases.release(lease);
      throw err;
    }
    await syncDir(dir);
    return new JsonlSessionLog(ref.sessionId, final, lease, this.leases);
  }

  async activate(ref: SessionRef): Promise<{ log: SessionLog; records: LogRecord[]; corruptLines: number[] }> {
    const file = this.file(ref);
    const before = await this.read(ref);
    let lastEpoch = 0;
    for (const r of before) if (r.t === "epoch") lastEpoch = Math.max(lastEpoch, r.epoch);
    const lease = await this.leases.acquire(this.base(ref), ref.sessionId, lastEpoch);
    try {
      await repairTornTail(ref.sessionId, file);
      const log = new JsonlSessionLog(ref.sessionId, file, lease, this.leases);
      await log.append({ t: "epoch", epoch: lease.epoch, runnerId: this.leases.self.runnerId }, true);
      // Read again: the previous owner may have appended between the first read and the lease.
      return { log, ...(await this.parsed(ref)) };
    } catch (err) {
      await this.leases.release(lease);
      throw err;
    }
  }

  async read(ref: SessionRef): Promise<LogRecord[]> {
    return (await this.parsed(ref)).records;
  }

  private async parsed(ref: SessionRef): Promise<ParsedLog> {
    const parsed = parseLog(await readFile(this.file(ref), "utf8"));
    if (!headerMatches(parsed.records, ref)) throw notThere(ref);
    return parsed;
  }

  async list(owner?: Identity): Promise<StoredSession[]> {
    const dirs = owner ? [this.ownerDir(owner)] : await this.ownerDirs();
    const out: StoredSession[] = [];
    for (const dir of dirs) out.push(...(await this.listDir(dir)));
    return out;
  }

  /** Every owner's folder: sessions/<tenant>/<principal>. */
  private async ownerDirs(): Promise<string[]> {
    const dirs: string[] = [];
    for (const tenant of await readdir(this.dir, { withFileTypes: true }).catch(() => []))
      if (tenant.isDirectory())
        for (const principal of await readdir(path.join(this.dir, tenant.name), { withFileTypes: true }))
          if (principal.isDirectory()) dirs.push(path.join(this.dir, tenant.name, principal.name));
    return dirs;
  }

  private async listDir(dir: string): Promise<StoredSession[]> {
    const names = await readdir(dir).catch(() => [] as string[]);
    const out: StoredSession[] = [];
    for (const name of names) {
      if (!name.endsWith(".jsonl")) continue; // leftover .tmp files of interrupted creates are skipped
      const file = path.join(dir, name);
      try {
        // The header is the first line; reading 4 KiB avoids reading whole logs to list them.
        const fh = await open(file, "r");
        const { bytesRead, buffer } = await fh.read(Buffer.alloc(4096), 0, 4096, 0);
        const s = await fh.stat();
        await fh.close();
        const head = JSON.parse(buffer.subarray(0, bytesRead).toString("utf8").split("\n")[0]) as LogRecord;
        // A log counts where its header's owner and id put it, and nowhere else.
        if (head.t !== "session" || this.file(refOf(ownerOf(head), head.sessionId)) !== file) continue;
        out.push({
          sessionId: head.sessionId,
          agentId: head.agentId,
          owner: ownerOf(head),
          createdMs: head.createdMs,
          updateMs: s.mtimeMs,
        });
      } catch {
        // A log being created right now, or not ours: not listed.
      }
    }
    return out;
  }
}

/** A record torn by a crash at the very end is cut off before anything is appended after it. */
async function repairTornTail(sessionId: string, file: string): Promise<void> {
  const fh = await open(file, "r+");
  try {
    const { size } = await fh.stat();
    if (size === 0) return;
    // Find the last newline; anything after it is a partial record that was never acknowledged.
    const tailLen = Math.min(size, 64 * 1024);
    const { buffer, bytesRead } = await fh.read(Buffer.alloc(tailLen), 0, tailLen, size - tailLen);
    const lastNl = buffer.subarray(0, bytesRead).lastIndexOf(10);
    if (lastNl === bytesRead - 1) return;
    if (lastNl < 0 && size > tailLen)
      throw new Error(`session log ${sessionId}: last record longer than 64 KiB and torn`);
    await fh.truncate(size - tailLen + lastNl + 1);
    await fh.datasync();
  } finally {
    await fh.close();
  }
}
