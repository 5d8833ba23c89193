// The audit log: one JSONL file per runner data directory (<data-dir>/audit.jsonl), fsynced per
// record. Every abort goes here (who stopped what, when, why), and every message a safety check
// blocked or flagged.
import { mkdir, open, type FileHandle } from "node:fs/promises";
import path from "node:path";

export type AuditRecord =
  | {
      action: "abort";
      sessionId: string;
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

/** Where audit records go: this file, or the PostgreSQL store's table (pg-stores.ts). */
export interface AuditSink {
  /** Resolves once the record is durable; rejects when it could not be written. */
  record(rec: AuditRecord): Promise<void>;
  /** Waits for the records in flight. */
  close(): Promise<void>;
}

/**
 * Appends records in order, each fsynced before its promise resolves. A failed write (a full disk,
 * the file removed or unwritable) fails that record only: the file is opened again for the next
 * one, which starts on a new line so a torn record stays alone on its own.
 */
export class AuditLog implements AuditSink {
  private fh?: Promise<FileHandle>;
  private tail: Promise<void> = Promise.resolve();
  private torn = false;
  constructor(private readonly dataDir: string) {}

  record(rec: AuditRecord): Promise<void> {
    const line = `${JSON.stringify({ time: new Date().toISOString(), ...rec })}\n`;
    const write = this.tail
      .catch(() => undefined)
      .then(async () => {
        this.fh ??= mkdir(this.dataDir, { recursive: true }).then(() =>
          open(path.join(this.dataDir, "audit.jsonl"), "a"),
        );
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

  async close(): Promise<void> {
    await this.tail.catch(() => undefined);
    if (this.fh) await (await this.fh.catch(() => undefined))?.close();
  }
}
