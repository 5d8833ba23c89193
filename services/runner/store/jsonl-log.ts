// One session's JSONL file, as the file store writes and reads it: appends by group commit, each
// line stamped with its writer's epoch; the parse that leaves out a fenced owner's late lines and
// skips damaged ones; the repair of a tail torn by a crash.
import { writeSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { SessionElsewhere, type Lease, type SessionLeases } from "../session/session-lease.js";
import { appendStarted } from "./append-telemetry.js";
import type { LogRecord, SessionLog } from "../session/session-log.js";

/** One line of the log; records written by an owner carry its epoch (the header has none). */
export function logLine(record: LogRecord, epoch?: number): string {
  const json = JSON.stringify(record);
  return epoch === undefined ? `${json}\n` : `{"e":${epoch},${json.slice(1)}\n`;
}

/** An idle log closes its file after this long and reopens it on the next append. */
const IDLE_CLOSE_MS = 2000;

/**
 * Group commit: records appended in one turn of the event loop, or while a sync is in flight, are
 * written together by one write, and fsynced once if any of them asked for it. Order is append
 * order; a promise resolves when its record is written (and synced, if asked). After a failed
 * write every later append fails: nothing is acknowledged past a hole in the log. Each line
 * carries the writer's epoch, and every sync checks that the lease still holds.
 *
 * The write itself is synchronous (a few KB into the page cache, about 2 µs); the fsync is not. A
 * write handed to libuv's thread pool cost the busy runner 50 µs or more of its loop each, in
 * thread hand-offs (bench/history.md, "The cost of a turn"). The price: a disk so far behind
 * that the kernel throttles writers stalls the loop for that write, where it stalled the pool's
 * threads (and every fsync queued behind them) before.
 */
export class JsonlSessionLog implements SessionLog {
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
    this.writing ??= this.drainSoon();
    return done;
  }

  /** Drains once this turn of the event loop is over, so what it appended goes in one write. */
  private async drainSoon(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve));
    await this.drain();
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
        for (let off = 0; off < bytes.length; ) off += writeSync(fh.fd, bytes, off);
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

  async close(options: { keepLease?: boolean } = {}): Promise<void> {
    clearTimeout(this.idleTimer);
    await this.writing;
    if (this.dirty && !this.failed) await this.fh?.datasync().catch(() => undefined);
    await this.fh?.close().catch(() => undefined);
    this.fh = undefined;
    // Released after a failed write too: the next activation cuts a torn tail before it appends,
    // and a damaged line in the middle is skipped by readers.
    if (!options.keepLease) await this.leases.release(this.lease);
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

/** A record torn by a crash at the very end is cut off before anything is appended after it. */
export async function repairTornTail(sessionId: string, file: string): Promise<void> {
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
