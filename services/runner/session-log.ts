// The durable record of a session: one append-only JSONL file per session under
// <data-dir>/sessions/. Every accepted client frame and every complete event is appended in seq
// order; a record that was acknowledged was fsynced first. Token deltas are not kept (the complete
// message that follows them is). Anything that can append and replay records can replace it.
import { mkdir, open, readFile, readdir, stat, type FileHandle } from "node:fs/promises";
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

  async create(sessionId: string, agentId: string): Promise<SessionLog> {
    await mkdir(this.dir, { recursive: true });
    // "wx": two creators of one id cannot both succeed.
    const fh = await open(this.file(sessionId), "wx");
    const log = new JsonlSessionLog(fh);
    await log.append({ t: "session", sessionId, agentId, createdMs: Date.now() }, true);
    return log;
  }

  async open(sessionId: string): Promise<SessionLog> {
    return new JsonlSessionLog(await open(this.file(sessionId), "a"));
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
      if (!name.endsWith(".jsonl")) continue;
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
