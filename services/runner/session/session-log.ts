// The durable record of a session, as every store keeps it: its records (accepted client frames
// and complete events, in seq order; token deltas are not kept, the complete message that follows
// them is), the log an activation appends to, and the SessionStore contract. A record that was
// acknowledged was made durable first. Stores: jsonl-session-store.ts (files, the embedded
// default), pg-session-store.ts (PostgreSQL), in-memory-store.ts (tests).
import { DEV_IDENTITY, type Identity } from "../../shared/auth/auth.js";
import type { SessionRef } from "../../shared/session-ref.js";

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
  // reset to start at message `contextFrom`, or its client tools were set (each only when set).
  | {
      t: "settings";
      queueMode?: number;
      model?: string;
      reasoningEffort?: string;
      contextFrom?: number;
      clientTools?: ClientToolRecord[];
    }
  | { t: "event"; event: unknown }
  // seq values up to `upTo` may have been handed out; a restart continues after it.
  | { t: "seq"; upTo: number }
  // The actor left memory cleanly with `seq` as its last seq: nothing was handed out beyond it.
  | { t: "closed"; seq: number }
  // These messages leave the history (a heartbeat that found nothing to say); their events stay.
  | { t: "elided"; messageIds: string[] }
  // Nothing was owed when this was written: no run going, waiting or queued. A log whose last
  // record (epoch, seq and closed records aside) is this owes nothing to whoever takes it.
  | { t: "settled" };

/**
 * Whether the log owes nothing: its last record that is not an epoch, a seq reservation or a
 * close (written by every activation and every close, a run handed over at a shutdown included)
 * is `settled`.
 */
export function settledLog(records: readonly LogRecord[]): boolean {
  for (let i = records.length - 1; i >= 0; i--) {
    const t = records[i].t;
    if (t !== "epoch" && t !== "seq" && t !== "closed") return t === "settled";
  }
  return false;
}

/** A client tool as the log keeps it (ClientTool's fields). */
export interface ClientToolRecord {
  name: string;
  description: string;
  parametersJson: string;
}

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
  /**
   * Flushes, then gives the session up (its lease) for the next activation anywhere. With
   * `keepLease` the lease stays this process's until it exits: the session then counts as left
   * by a process that is gone (SessionStore.orphans), so whichever runner sweeps first resumes it.
   */
  close(options?: { keepLease?: boolean }): Promise<void>;
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
  /** A sub-agent's session: its parent's id (same owner). */
  parentSessionId?: string;
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
   * lines of the log that were damaged and skipped (the actor reports them). Rejects with
   * sessionNotThere's error when there is no such session.
   */
  activate(ref: SessionRef): Promise<{ log: SessionLog; records: LogRecord[]; corruptLines: number[] }>;
  /** The session's valid records (a stale owner's late writes left out). */
  read(ref: SessionRef): Promise<LogRecord[]>;
  /** One principal's sessions; without `owner`, everyone's (retention sweeps). */
  list(owner?: Identity): Promise<StoredSession[]>;
  /** Deletes the session's log for good; false when there was none. Call with no activation of it open. */
  remove(ref: SessionRef): Promise<boolean>;
  /**
   * The sessions still held by a runner process that is gone without giving them up (a crash, a
   * SIGKILL, the OOM killer, a lost node, or a shutdown that handed a run over: close with
   * keepLease): an earlier process of this runner (same id and address), or another runner whose
   * heartbeat has stopped. What they may have left half done: a session whose log is settled
   * (settledLog) owes nothing and is not listed; it is taken over when it is next asked for.
   */
  orphans(): Promise<SessionRef[]>;
}

/** What a store rejects with for a session it does not hold: code ENOENT, whatever the backend. */
export const sessionNotThere = (ref: SessionRef): Error =>
  Object.assign(new Error(`session ${ref.sessionId} does not exist`), { code: "ENOENT" });
