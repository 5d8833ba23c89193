// The durable record of a session: one append-only JSONL file per session under
// <data-dir>/sessions/. Every accepted client frame and every complete event is appended in seq
// order; a record that was acknowledged was fsynced first. Token deltas are not kept (the complete
// message that follows them is). Anything that can append and replay records can replace it.
import { randomUUID } from "node:crypto";
import { link, mkdir, open, readFile, readdir, stat, unlink, type FileHandle } from "node:fs/promises";
import path from "node:path";

/** One line of the log. Frames and events are stored in protobuf JSON form. */
export type LogRecord =
  | { t: "session"; sessionId: string; agentId: string; createdMs: number }
  | { t: "frame"; frame: unknown }
  // The session's default queue mode changed.
  | { t: "settings"; queueMode: number }
  | { t: "event"; event: unknown }
  // seq values up to `upTo` may have been handed out; a restart continues after it.
  | { t: "seq"; upTo: number }
  // The actor left memory cleanly with `seq` as its last seq: nothing was handed out beyond it.
  | { t: "closed"; seq: number };

export interface SessionLog {
  append(record: LogRecord, sync?: boolean): Promise<void>;
  /** Resolves once everything appended so far is written. */
  flush(): Promise<void>;
  close(): Promise<void>;
}

export interface StoredSession {
  sessionId: string;
  agentId: string;
  createdMs: number;
  updateMs: number;
}

export interface SessionStore {
  exists(sessionId: string): Promise<boolean>;
  create(sessionId: string, agentId: string): Promise<SessionLog>;
  open(sessionId: string): Promise<SessionLog>;
  read(sessionId: string): Promise<LogRecord[]>;
  list(): Promise<StoredSession[]>;
}

/**
 * Group commit: records appended while a write is in flight are written together by the next one,
 * and fsynced once if any of them asked for it. Order is append order; a promise resolves when
 * its record is written (and synced, if asked). After a failed write every later append fails:
 * nothing is acknowledged past a hole in the log.
 */
/** Makes a directory's entries (a newly linked file) durable. */
async function syncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

class JsonlSessionLog implements SessionLog {
  private batch: string[] = [];
  private batchSync = false;
  private waiters: { resolve(): void; reject(err: unknown): void }[] = [];
  private writing?: Promise<void>;
  private failed?: unknown;
  private dirty = false;
  constructor(private readonly fh: FileHandle) {}

  append(record: LogRecord, sync = false): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    this.batch.push(JSON.stringify(record) + "\n");
    this.batchSync ||= sync;
    const done = new Promise<void>((resolve, reject) => this.waiters.push({ resolve, reject }));
    this.writing ??= this.drain();
    return done;
  }

  async flush(): Promise<void> {
    await this.writing;
  }

  private async drain(): Promise<void> {
    while (this.batch.length > 0) {
      const data = this.batch.join("");
      const sync = this.batchSync;
      const waiters = this.waiters;
      this.batch = [];
      this.batchSync = false;
      this.waiters = [];
      try {
        const bytes = Buffer.from(data, "utf8");
        // The file is opened for appending, so each write lands at the end; loop on short writes.
        for (let off = 0; off < bytes.length; ) off += (await this.fh.write(bytes, off)).bytesWritten;
        if (sync) await this.fh.datasync();
        this.dirty = !sync;
        for (const w of waiters) w.resolve();
      } catch (err) {
        this.failed = err;
        for (const w of [...waiters, ...this.waiters]) w.reject(err);
        this.waiters = [];
        this.batch = [];
      }
    }
    this.writing = undefined;
  }

  async close(): Promise<void> {
    await this.writing;
    if (this.dirty && !this.failed) await this.fh.datasync().catch(() => undefined);
    await this.fh.close();
  }
}

export class JsonlSessionStore implements SessionStore {
  private readonly dir: string;
  constructor(dataDir: string) {
    this.dir = path.join(dataDir, "sessions");
  }

  private file(sessionId: string): string {
    return path.join(this.dir, `${sessionId}.jsonl`);
  }

  async exists(sessionId: string): Promise<boolean> {
    return stat(this.file(sessionId)).then(
      () => true,
      () => false,
    );
  }

  /**
   * Creates the log with its header atomically: the header is written and fsynced to a temporary
   * file that is then linked into place. A crash leaves either no log or a complete header, and
   * link() fails with EEXIST if someone else created the session first.
   */
  async create(sessionId: string, agentId: string): Promise<SessionLog> {
    await mkdir(this.dir, { recursive: true });
    const final = this.file(sessionId);
    const tmp = `${final}.${process.pid}.${randomUUID()}.tmp`;
    const header: LogRecord = { t: "session", sessionId, agentId, createdMs: Date.now() };
    const fh = await open(tmp, "wx");
    try {
      await fh.write(JSON.stringify(header) + "\n");
      await fh.datasync();
    } finally {
      await fh.close();
    }
    try {
      await link(tmp, final);
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
    await syncDir(this.dir);
    return new JsonlSessionLog(await open(final, "a"));
  }

  /** Opens for appending. A record torn by a crash at the very end is cut off first. */
  async open(sessionId: string): Promise<SessionLog> {
    const file = this.file(sessionId);
    const fh = await open(file, "r+");
    const { size } = await fh.stat();
    if (size > 0) {
      // Find the last newline; anything after it is a partial record that was never acknowledged.
      const tailLen = Math.min(size, 64 * 1024);
      const { buffer, bytesRead } = await fh.read(Buffer.alloc(tailLen), 0, tailLen, size - tailLen);
      const lastNl = buffer.subarray(0, bytesRead).lastIndexOf(10);
      if (lastNl !== bytesRead - 1) {
        if (lastNl < 0 && size > tailLen) throw new Error(`session log ${sessionId}: last record longer than 64 KiB and torn`);
        await fh.truncate(size - tailLen + lastNl + 1);
        await fh.datasync();
      }
    }
    await fh.close();
    return new JsonlSessionLog(await open(file, "a"));
  }

  async read(sessionId: string): Promise<LogRecord[]> {
    const text = await readFile(this.file(sessionId), "utf8");
    const records: LogRecord[] = [];
    const lines = text.split("\n");
    for (let i = 0; i < lines.length; i++) {
      if (lines[i] === "") continue;
      try {
        records.push(JSON.parse(lines[i]) as LogRecord);
      } catch {
        // Only the last line can be torn (a crash mid-append); it was never acknowledged.
        if (i < lines.length - 2) throw new Error(`session log ${sessionId} is corrupt at line ${i + 1}`);
      }
    }
    return records;
  }

  async list(): Promise<StoredSession[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const out: StoredSession[] = [];
    for (const name of names) {
      if (!name.endsWith(".jsonl")) continue; // leftover .tmp files of interrupted creates are skipped
      const file = path.join(this.dir, name);
      try {
        // The header is the first line; reading 4 KiB avoids reading whole logs to list them.
        const fh = await open(file, "r");
        const { bytesRead, buffer } = await fh.read(Buffer.alloc(4096), 0, 4096, 0);
        const s = await fh.stat();
        await fh.close();
        const head = JSON.parse(buffer.subarray(0, bytesRead).toString("utf8").split("\n")[0]) as LogRecord;
        if (head.t !== "session") continue;
        out.push({ sessionId: head.sessionId, agentId: head.agentId, createdMs: head.createdMs, updateMs: s.mtimeMs });
      } catch {
        // A log being created right now, or not ours: not listed.
      }
    }
    return out;
  }
}
