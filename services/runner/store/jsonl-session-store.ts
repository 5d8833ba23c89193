// The file store, the embedded default: one append-only JSONL file per session, at
// <data-dir>/sessions/<tenant>/<principal>/<session>.jsonl. Each part is encoded by filePart, so
// no two owners' ids meet in one file; the header keeps the raw ids and is compared on every read.
// Leases with epochs (session-lease.ts) fence runners that share the directory.
import { randomUUID } from "node:crypto";
import { mkdir, open, readFile, readdir, rm, stat } from "node:fs/promises";
import path from "node:path";
import type { Identity } from "../../shared/auth/auth.js";
import { createExclusive, syncDir } from "../../shared/exclusive-file.js";
import { filePart, refOf, type SessionRef } from "../../shared/session-ref.js";
import { migrateFlatLogs } from "./flat-logs.js";
import { JsonlSessionLog, logLine, parseLog, repairTornTail, type ParsedLog } from "./jsonl-log.js";
import { SessionLeases, type Owner } from "../session/session-lease.js";
import {
  ownerOf,
  sessionHeader,
  sessionNotThere,
  settledLog,
  type LogRecord,
  type SessionLog,
  type SessionOwner,
  type StoredSession,
  type SessionStore,
  type Subagent,
} from "../session/session-log.js";

/** Whether a log's header names this session of this owner (a foreign or legacy-misplaced file does not count). */
function headerMatches(records: LogRecord[], ref: SessionRef): boolean {
  const head = records[0];
  if (head?.t !== "session") return false;
  const owner = ownerOf(head);
  return head.sessionId === ref.sessionId && owner.tenant === ref.tenant && owner.principal === ref.principal;
}

/** Where a data directory keeps a session's log (for operators and tests; the store uses the same). */
/** A log header longer than this is not a header this store wrote. */
const MAX_HEADER_BYTES = 256 * 1024;
/** How much of a log's end the orphan sweep reads to see whether it is settled. */
const TAIL_BYTES = 64 * 1024;

export const sessionLogPath = (dataDir: string, ref: SessionRef): string =>
  path.join(dataDir, "sessions", filePart(ref.tenant), filePart(ref.principal), `${filePart(ref.sessionId)}.jsonl`);

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
    if (!headerMatches(parsed.records, ref)) throw sessionNotThere(ref);
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

  async orphans(): Promise<SessionRef[]> {
    const out: SessionRef[] = [];
    // Each holder's heartbeat is read once a sweep.
    const alive = new Map<string, Promise<boolean>>();
    for (const dir of await this.ownerDirs()) {
      for (const name of await readdir(dir).catch(() => [] as string[])) {
        const m = /^(.+)\.lease\.\d+$/.exec(name);
        if (!m) continue;
        const holder = await readFile(path.join(dir, name), "utf8")
          .then((t) => JSON.parse(t) as Owner)
          .catch(() => undefined);
        if (!holder) continue;
        const key = `${holder.runnerId}\0${holder.address}\0${holder.incarnation}`;
        if (!alive.has(key)) alive.set(key, this.leases.alive(holder));
        if (await alive.get(key)) continue;
        const file = path.join(dir, `${m[1]}.jsonl`);
        if (await this.settledTail(file)) continue;
        const head = await this.header(file);
        if (head) out.push(refOf(ownerOf(head), head.sessionId));
      }
    }
    return out;
  }

  /**
   * Whether the log ends settled (settledLog), from its last 64 KiB read forwards (a stale holder's
   * late write is known from the epoch records before it): a log that cannot be read is not.
   */
  private async settledTail(file: string): Promise<boolean> {
    try {
      const fh = await open(file, "r");
      try {
        const { size } = await fh.stat();
        const from = Math.max(0, size - TAIL_BYTES);
        const buf = Buffer.alloc(size - from);
        const { bytesRead } = await fh.read(buf, 0, buf.length, from);
        let text = buf.subarray(0, bytesRead).toString("utf8");
        // A tail that starts inside a line starts at the next one.
        if (from > 0) text = text.slice(text.indexOf("\n") + 1);
        return settledLog(parseLog(text).records);
      } finally {
        await fh.close();
      }
    } catch {
      return false;
    }
  }

  /** A log's header (its first line; 4 KiB are read, not the whole log), if the file is a log that sits where its header puts it. */
  private async header(file: string): Promise<Extract<LogRecord, { t: "session" }> | undefined> {
    try {
      const fh = await open(file, "r");
      try {
        // The header is the first line: most fit in 4 KiB; a sub-agent's carries its instruction
        // (up to 16,000 characters), so the read goes on to the line's end, within a bound.
        let line = Buffer.alloc(0);
        for (let at = 0; at < MAX_HEADER_BYTES; ) {
          const { bytesRead, buffer } = await fh.read(Buffer.alloc(4096), 0, 4096, at);
          if (bytesRead === 0) break;
          line = Buffer.concat([line, buffer.subarray(0, bytesRead)]);
          at += bytesRead;
          if (buffer.subarray(0, bytesRead).includes(0x0a)) break;
        }
        const end = line.indexOf(0x0a);
        const head = JSON.parse(line.subarray(0, end < 0 ? line.length : end).toString("utf8")) as LogRecord;
        return head.t === "session" && this.file(refOf(ownerOf(head), head.sessionId)) === file ? head : undefined;
      } finally {
        await fh.close();
      }
    } catch {
      return undefined;
    }
  }

  private async listDir(dir: string): Promise<StoredSession[]> {
    const names = await readdir(dir).catch(() => [] as string[]);
    const out: StoredSession[] = [];
    for (const name of names) {
      if (!name.endsWith(".jsonl")) continue; // leftover .tmp files of interrupted creates are skipped
      const file = path.join(dir, name);
      // A log being created right now, or not ours: not listed.
      const head = await this.header(file);
      const st = head && (await stat(file).catch(() => undefined));
      if (!head || !st) continue;
      out.push({
        sessionId: head.sessionId,
        agentId: head.agentId,
        owner: ownerOf(head),
        createdMs: head.createdMs,
        updateMs: Math.floor(st.mtimeMs), // file times have sub-millisecond parts; a Timestamp wants whole nanoseconds
        ...(head.subagent ? { parentSessionId: head.subagent.parentSessionId } : {}),
      });
    }
    return out;
  }
}
