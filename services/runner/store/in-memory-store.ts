// A SessionStore and a ScheduleStore that keep everything in this process (storage.ts gathers them
// with a profile store as inMemoryStorage()): the in-process test tier drives the session
// actor and the registry with it, and it is the reference for what any store must do (the file
// store and, next, a networked one). It is a real implementation, not a mock: records, epochs,
// fencing and refs behave as the contract says; only durability is missing.
//
// For tests it can also fail: failAppends(n) makes the next n appends fail as a full disk would.
import type { Identity } from "../../shared/auth/auth.js";
import { refKey, type SessionRef } from "../../shared/session-ref.js";
import type { ScheduleFile, ScheduleStore } from "./schedule-files.js";
import { SessionElsewhere } from "../session/session-lease.js";
import {
  ownerOf,
  sessionHeader,
  type LogRecord,
  type SessionLog,
  type SessionOwner,
  type SessionStore,
  type StoredSession,
  type Subagent,
} from "../session/session-log.js";

interface Stored {
  ref: SessionRef;
  records: LogRecord[];
  /** The epoch of the activation that may write; older logs are fenced. */
  epoch: number;
  updateMs: number;
}

class InMemoryLog implements SessionLog {
  private failed?: unknown;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    private readonly store: InMemorySessionStore,
    private readonly session: Stored,
    readonly epoch: number,
  ) {}

  append(record: LogRecord, _sync = false): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    // Asynchronous, in order, like a real log's group commit.
    const next = this.writing.then(() => {
      if (this.failed) throw this.failed;
      if (this.session.epoch !== this.epoch)
        throw (this.failed = new SessionElsewhere(
          `session ${this.session.ref.sessionId} was taken over; this log no longer writes it`,
        ));
      const err = this.store.takeFailure();
      if (err) throw (this.failed = err);
      this.session.records.push(structuredClone(record));
      this.session.updateMs = Date.now();
    });
    this.writing = next.catch(() => undefined);
    return next;
  }

  flush(): Promise<void> {
    return this.writing;
  }

  async close(): Promise<void> {
    await this.writing;
  }
}

export class InMemorySessionStore implements SessionStore {
  private readonly sessions = new Map<string, Stored>();
  private failures: { left: number; error: () => Error } = { left: 0, error: () => new Error("no failure") };

  /** The next `n` appends fail with `error` (by default ENOSPC), as a full disk would. */
  failAppends(
    n: number,
    error: () => Error = () => Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" }),
  ): void {
    this.failures = { left: n, error };
  }

  /** @internal for InMemoryLog: the failure the next append meets, if any. */
  takeFailure(): Error | undefined {
    if (this.failures.left <= 0) return undefined;
    this.failures.left--;
    return this.failures.error();
  }

  /** A copy of a session's records, as a reader sees them. */
  records(ref: SessionRef): LogRecord[] {
    return structuredClone(this.sessions.get(refKey(ref))?.records ?? []);
  }

  /** Removes the last record that passes `test`, as if the process had died before writing it. */
  dropLast(ref: SessionRef, test: (r: LogRecord) => boolean): void {
    const records = this.sessions.get(refKey(ref))?.records ?? [];
    for (let i = records.length - 1; i >= 0; i--)
      if (test(records[i])) {
        records.splice(i, 1);
        return;
      }
  }

  async remove(ref: SessionRef): Promise<boolean> {
    return this.sessions.delete(refKey(ref));
  }

  async exists(ref: SessionRef): Promise<boolean> {
    return this.sessions.has(refKey(ref));
  }

  /** Nothing: a process's memory is gone with it. */
  async orphans(): Promise<SessionRef[]> {
    return [];
  }

  async create(
    ref: SessionRef,
    agentId: string,
    owner: SessionOwner,
    subagent?: Subagent,
    opening: LogRecord[] = [],
  ): Promise<SessionLog> {
    const key = refKey(ref);
    if (this.sessions.has(key)) throw Object.assign(new Error(`session ${ref.sessionId} exists`), { code: "EEXIST" });
    const header = sessionHeader(ref, agentId, owner, subagent);
    const stored: Stored = {
      ref,
      records: [header, { t: "epoch", epoch: 1, runnerId: "in-memory" }, ...structuredClone(opening)],
      epoch: 1,
      updateMs: Date.now(),
    };
    this.sessions.set(key, stored);
    return new InMemoryLog(this, stored, 1);
  }

  async activate(ref: SessionRef): Promise<{ log: SessionLog; records: LogRecord[]; corruptLines: number[] }> {
    const stored = this.sessions.get(refKey(ref));
    if (!stored) throw Object.assign(new Error(`session ${ref.sessionId} does not exist`), { code: "ENOENT" });
    // A new activation fences every earlier one: their appends fail from now on.
    stored.epoch++;
    stored.records.push({ t: "epoch", epoch: stored.epoch, runnerId: "in-memory" });
    return {
      log: new InMemoryLog(this, stored, stored.epoch),
      records: structuredClone(stored.records),
      corruptLines: [],
    };
  }

  async read(ref: SessionRef): Promise<LogRecord[]> {
    const stored = this.sessions.get(refKey(ref));
    if (!stored) throw Object.assign(new Error(`session ${ref.sessionId} does not exist`), { code: "ENOENT" });
    return structuredClone(stored.records);
  }

  async list(owner?: Identity): Promise<StoredSession[]> {
    const out: StoredSession[] = [];
    for (const s of this.sessions.values()) {
      const head = s.records[0];
      if (head?.t !== "session") continue;
      if (owner && (s.ref.tenant !== owner.tenant || s.ref.principal !== owner.principal)) continue;
      out.push({
        sessionId: s.ref.sessionId,
        agentId: head.agentId,
        owner: ownerOf(head),
        createdMs: head.createdMs,
        updateMs: s.updateMs,
        ...(head.subagent ? { parentSessionId: head.subagent.parentSessionId } : {}),
      });
    }
    return out;
  }
}

/** Schedules kept in this process: the ScheduleStore contract without files. */
export class InMemoryScheduleStore implements ScheduleStore {
  private readonly files = new Map<string, ScheduleFile>();

  async read(ref: SessionRef): Promise<ScheduleFile | undefined> {
    const f = this.files.get(refKey(ref));
    return f && structuredClone(f);
  }

  async all(): Promise<ScheduleFile[]> {
    return [...this.files.values()].map((f) => structuredClone(f));
  }

  async write(ref: SessionRef, file: ScheduleFile | undefined): Promise<void> {
    if (file) this.files.set(refKey(ref), structuredClone(file));
    else this.files.delete(refKey(ref));
  }
}
