// The audit log: one JSONL file per runner data directory (<data-dir>/audit.jsonl), fsynced per
// record. Every abort goes here (who stopped what, when, why), and every message a safety check
// blocked or flagged.
import { mkdir, open, type FileHandle } from "node:fs/promises";
import path from "node:path";

export type AuditRecord =
  | {
      /** A decision on a tool call the approval policy held (who, what; the record's time is when). */
      action: "tool_decision";
      sessionId: string;
      tenant: string;
      turnId: string;
      toolCallId: string;
      toolName: string;
      verdict: string;
      decidedBy: string;
      /** The decision's frame; "" for the policy's timeout. */
      frameId: string;
      message: string;
      argumentsJson: string;
    }
  | {
      action: "abort";
      sessionId: string;
      tenant: string;
      frameId: string;
      reason: string;
      /** The run that was going, if any. */
      turnId: string;
      clearQueue: boolean;
    }
  | {
      /** blocked: the message never reached the agent; flagged: it did, with a medium threat. */
      action: "message_blocked" | "message_flagged";
      sessionId: string;
      frameId: string;
      tenant: string;
      sender: string;
      check: string;
      level: string;
      reason: string;
      /** The first 200 characters of the message. */
      excerpt: string;
    }
  | {
      /** A tool's output read as instructions: the model got it behind a warning. */
      action: "tool_result_flagged";
      sessionId: string;
      toolCallId: string;
      toolName: string;
      tenant: string;
      check: string;
      level: string;
      reason: string;
      excerpt: string;
    }
  | {
      /** A recalled memory read as instructions: left out of the prompt. */
      action: "memory_withheld";
      sessionId: string;
      tenant: string;
      check: string;
      level: string;
      reason: string;
      excerpt: string;
    };

/** Which records to read back: the newest `limit`, of one tenant or session when named. */
export interface AuditQuery {
  limit: number;
  tenant?: string;
  sessionId?: string;
}

/** A record as read back: when it was written, by which runner when the log knows. */
export interface StoredAudit {
  timeMs: number;
  runnerId?: string;
  record: AuditRecord;
}

export const auditMatches = (rec: AuditRecord, q: AuditQuery): boolean =>
  (!q.tenant || rec.tenant === q.tenant) && (!q.sessionId || rec.sessionId === q.sessionId);

/** Where audit records go: this file, or the PostgreSQL store's table (pg-stores.ts). */
export interface AuditSink {
  /** Resolves once the record is durable; rejects when it could not be written. */
  record(rec: AuditRecord): Promise<void>;
  /** The newest records first. True for `shared`: every runner reads (and writes) this one log. */
  read(query: AuditQuery): Promise<StoredAudit[]>;
  readonly shared: boolean;
  /** Waits for the records in flight. */
  close(): Promise<void>;
}

/**
 * Appends records in order, each fsynced before its promise resolves. A failed write (a full disk,
 * the file removed or unwritable) fails that record only: the file is opened again for the next
 * one, which starts on a new line so a torn record stays alone on its own.
 */
export class AuditLog implements AuditSink {
  readonly shared = false;
  private fh?: Promise<FileHandle>;
  private tail: Promise<void> = Promise.resolve();
  private torn = false;
  constructor(private readonly dataDir: string) {}

  record(rec: AuditRecord): Promise<void> {
    const line = `${JSON.stringify({ time: new Date().toISOString(), ...rec })}\n`;
    const write = this.tail
      .catch(() => undefined)
      .then(async () => {
        this.fh ??= this.openForAppend();
        const opened = this.fh;
        try {
          const h = await opened;
          await h.write(this.torn ? `\n${line}` : line);
          await h.datasync();
          this.torn = false;
        } catch (err) {
          this.torn = true;
          if (this.fh === opened) this.fh = undefined;
          opened.then((h) => h.close()).catch(() => undefined);
          throw err;
        }
      });
    this.tail = write;
    return write;
  }

  /** Opens the file; one left torn by a crash before this process gets its next record on a new line. */
  private async openForAppend(): Promise<FileHandle> {
    await mkdir(this.dataDir, { recursive: true });
    const h = await open(path.join(this.dataDir, "audit.jsonl"), "a+");
    const { size } = await h.stat();
    if (size > 0) {
      const last = Buffer.alloc(1);
      await h.read(last, 0, 1, size - 1);
      if (last[0] !== 10) this.torn = true;
    }
    return h;
  }

  /**
   * Reads the file backwards in blocks until `limit` records match, so the cost follows what is
   * asked for, not the file's length. A torn line (a write cut by a crash) is skipped.
   */
  async read(query: AuditQuery): Promise<StoredAudit[]> {
    const found: StoredAudit[] = [];
    let fh: FileHandle;
    try {
      fh = await open(path.join(this.dataDir, "audit.jsonl"), "r");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return found;
      throw err;
    }
    try {
      let end = (await fh.stat()).size;
      let carry = Buffer.alloc(0);
      while (end > 0 && found.length < query.limit) {
        const start = Math.max(0, end - READ_BLOCK);
        const block = Buffer.alloc(end - start);
        await fh.read(block, 0, block.length, start);
        const text = Buffer.concat([block, carry]);
        // Bytes before the first newline may be the tail of a line that starts in an earlier block.
        const cut = start === 0 ? 0 : text.indexOf(10) + 1;
        if (cut === 0 && start > 0) {
          carry = text;
          end = start;
          continue;
        }
        carry = text.subarray(0, cut);
        const lines = text.subarray(cut).toString("utf8").split("\n").reverse();
        for (const line of lines) {
          if (found.length >= query.limit) break;
          const parsed = parseLine(line);
          if (parsed && auditMatches(parsed.record, query)) found.push(parsed);
        }
        end = start;
      }
    } finally {
      await fh.close();
    }
    return found;
  }

  async close(): Promise<void> {
    await this.tail.catch(() => undefined);
    if (this.fh) await (await this.fh.catch(() => undefined))?.close();
  }
}

const READ_BLOCK = 64 * 1024;

function parseLine(line: string): StoredAudit | undefined {
  if (line.trim() === "") return undefined;
  try {
    const { time, ...record } = JSON.parse(line) as AuditRecord & { time?: string };
    const timeMs = Date.parse(time ?? "");
    return typeof record.action === "string" && Number.isFinite(timeMs) ? { timeMs, record } : undefined;
  } catch {
    return undefined;
  }
}
