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
    };

export class AuditLog {
  private fh?: Promise<FileHandle>;
  private tail: Promise<void> = Promise.resolve();
  constructor(private readonly dataDir: string) {}

  record(rec: AuditRecord): Promise<void> {
    const line = JSON.stringify({ time: new Date().toISOString(), ...rec }) + "\n";
    this.fh ??= mkdir(this.dataDir, { recursive: true }).then(() => open(path.join(this.dataDir, "audit.jsonl"), "a"));
    const fh = this.fh;
    this.tail = this.tail.then(async () => {
      const h = await fh;
      await h.write(line);
      await h.datasync();
    });
    return this.tail;
  }

  async close(): Promise<void> {
    await this.tail.catch(() => undefined);
    if (this.fh) await (await this.fh).close();
  }
}
