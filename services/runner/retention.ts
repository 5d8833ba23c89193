// Sessions have an end. DeleteSession's work outside the log (memories when asked, schedules, the
// sandbox) is done here, and so is retention: an agent.json may say how many days an idle session
// is kept (retentionDays); a sweep (hourly by default) deletes the older ones as DeleteSession
// would, memories kept. A session the OpenAI endpoint made from one request's messages
// (CONVERSATION_SESSION_PREFIX) goes after an idle hour, whatever its agent says.
//
// A session goes with its descendants: the sub-agent sessions delegate_task made (delegate.ts),
// their children, and what each has outside its log. The memories of all of them go first when
// asked (a failure there deletes nothing); then the session itself, which makes every descendant
// unreachable at once (the registry answers NOT_FOUND for a sub-agent whose parent is gone); then
// the descendants. A crash between the two leaves orphans that nobody can read, and the sweep,
// which also runs once at start, deletes them.
import type { MemoryService } from "../shared/gen/troupe/v1/memory_pb.js";
import type { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { identityMetadata } from "../shared/auth/auth.js";
import type { Logger } from "../shared/process/log.js";
import { CONVERSATION_SESSION_IDLE_MS, CONVERSATION_SESSION_PREFIX } from "../shared/ids.js";
import type { ServiceClient } from "../shared/rpc.js";
import type { SessionRef } from "../shared/session-ref.js";
import type { AgentConfigs } from "./agent-config.js";
import type { ScheduleStore } from "./store/schedule-files.js";
import type { Identity } from "../shared/auth/auth.js";
import { failpoint } from "./loop/failpoints.js";
import type { SessionActor } from "./session/session-actor.js";
import type { SessionStore, StoredSession } from "./session/session-log.js";
import type { SessionRegistry } from "./session/session-registry.js";

const DAY_MS = 86_400_000;

export interface SessionParts {
  memory: ServiceClient<(typeof MemoryService)["method"]>;
  sandbox: ServiceClient<(typeof SandboxService)["method"]>;
  schedules: ScheduleStore;
  /** Called when schedules changed. Contract: never throws. */
  schedulesChanged(): void;
  /** Closes the session's MCP connections. Contract: never throws. */
  closeMcp?(ref: SessionRef): Promise<void>;
  logger: Logger;
}

/**
 * Clears what a deleted session has outside its log. Memories go first and only when asked: if
 * the memory service cannot answer, this rejects before anything is gone. May reject.
 */
export async function clearSessionParts(
  parts: SessionParts,
  actor: SessionActor,
  forgetMemories: boolean,
): Promise<{ memoriesForgotten: number; sandboxRemoved: boolean }> {
  const { owner, sessionId } = actor;
  let memoriesForgotten = 0;
  if (forgetMemories) {
    const scope = { tenant: owner.tenant, owner: owner.memoryOwner ?? owner.principal };
    memoriesForgotten = (await parts.memory.forgetMemories({ scope, sessionId })).forgotten;
  }
  await parts.schedules.write(actor.ref, undefined);
  parts.schedulesChanged();
  await parts.closeMcp?.(actor.ref);
  // A sandbox the service cannot remove now is removed by its idle timeout.
  const sandboxRemoved = await parts.sandbox
    .releaseSandbox({ sessionId, agentId: actor.agentId }, { metadata: identityMetadata(owner), timeoutMs: 30_000 })
    .then(
      (r) => r.removed,
      (err: Error) => {
        parts.logger.warn("a deleted session's sandbox is left to its idle timeout", { error: err.message });
        return false;
      },
    );
  return { memoriesForgotten, sandboxRemoved };
}

export interface Deletion {
  store: SessionStore;
  registry: SessionRegistry;
  parts: SessionParts;
}

/** The sub-agent sessions below `sessionId` among one owner's `sessions`, nearest first. */
export function descendantsOf(sessionId: string, sessions: readonly StoredSession[]): StoredSession[] {
  const children = new Map<string, StoredSession[]>();
  for (const s of sessions)
    if (s.parentSessionId !== undefined)
      (children.get(s.parentSessionId) ?? children.set(s.parentSessionId, []).get(s.parentSessionId)!).push(s);
  const out: StoredSession[] = [];
  const seen = new Set([sessionId]);
  for (let i = -1; i < out.length; i++)
    for (const c of children.get(i < 0 ? sessionId : out[i].sessionId) ?? [])
      if (!seen.has(c.sessionId)) seen.add(c.sessionId), out.push(c);
  return out;
}

/**
 * Deletes the caller's session `sessionId` and its descendants, as the file's head says.
 * NOT_FOUND when the caller has no such session. Rejects when the memories asked to be forgotten
 * cannot be (nothing is deleted then) or when the session itself cannot be; a descendant that
 * cannot be deleted now is left, unreachable, to the sweep.
 */
export async function deleteSessionTree(
  o: Deletion,
  sessionId: string,
  caller: Identity,
  forgetMemories: boolean,
): Promise<{ memoriesForgotten: number; sandboxRemoved: boolean }> {
  const root = await o.registry.require(sessionId, caller);
  const descendants = descendantsOf(sessionId, await o.store.list(caller));
  let memoriesForgotten = 0;
  if (forgetMemories) {
    const scope = { tenant: root.owner.tenant, owner: root.owner.memoryOwner ?? root.owner.principal };
    for (const id of [sessionId, ...descendants.map((d) => d.sessionId)])
      memoriesForgotten += (await o.parts.memory.forgetMemories({ scope, sessionId: id })).forgotten;
  }
  let sandboxRemoved = false;
  await o.registry.delete(sessionId, caller, async (actor) => {
    sandboxRemoved = (await clearSessionParts(o.parts, actor, false)).sandboxRemoved;
  });
  failpoint("runner.delete", sessionId);
  await deleteOrphans(o, descendants);
  return { memoriesForgotten, sandboxRemoved };
}

/** Deletes sub-agent sessions whose parent is gone, with what they hold outside their logs. */
async function deleteOrphans(o: Deletion, orphans: readonly StoredSession[]): Promise<number> {
  let deleted = 0;
  for (const s of orphans) {
    try {
      await o.registry.delete(s.sessionId, s.owner, (actor) =>
        clearSessionParts(o.parts, actor, false).then(() => undefined),
      );
      deleted++;
    } catch (err) {
      o.parts.logger.warn("a deleted session's sub-agent session is left to the next sweep", {
        session: s.sessionId,
        error: String((err as Error).message ?? err),
      });
    }
  }
  return deleted;
}

/** `all` less the orphans among it: what a listing shows. */
export function withoutOrphans(all: readonly StoredSession[]): StoredSession[] {
  const orphans = new Set(orphansAmong(all));
  return all.filter((s) => !orphans.has(s));
}

/** The sub-agent sessions among `all` whose parent is not among them (same owner). */
function orphansAmong(all: readonly StoredSession[]): StoredSession[] {
  const present = new Set(all.map((s) => `${s.owner.tenant}\0${s.owner.principal}\0${s.sessionId}`));
  return all.filter(
    (s) =>
      s.parentSessionId !== undefined && !present.has(`${s.owner.tenant}\0${s.owner.principal}\0${s.parentSessionId}`),
  );
}

/**
 * Every `everyMs`, and once at start: deletes the sessions idle longer than their agent's
 * retentionDays, with their descendants, and the sub-agent sessions whose parent is gone.
 */
export function startRetention(o: Deletion & { agents: AgentConfigs; everyMs: number }): {
  stop(): void;
  sweep(): Promise<number>;
} {
  const sweep = async (): Promise<number> => {
    let deleted = 0;
    const now = Date.now();
    const all = await o.store.list();
    for (const s of all) {
      if (s.parentSessionId !== undefined) continue; // goes with its parent
      const days = (await o.agents.get(s.agentId)).config.retentionDays;
      const idleMs = now - s.updateMs;
      const expired = s.sessionId.startsWith(CONVERSATION_SESSION_PREFIX)
        ? idleMs >= CONVERSATION_SESSION_IDLE_MS
        : days !== undefined && idleMs >= days * DAY_MS;
      if (!expired) continue;
      try {
        await deleteSessionTree(o, s.sessionId, s.owner, false);
        deleted++;
      } catch (err) {
        o.parts.logger.warn("retention: a session could not be deleted; trying again next sweep", {
          session: s.sessionId,
          error: String((err as Error).message ?? err),
        });
      }
    }
    if (deleted > 0) o.parts.logger.info(`retention: deleted ${deleted} idle session(s)`);
    const orphans = orphansAmong(deleted > 0 ? await o.store.list() : all);
    const finished = await deleteOrphans(o, orphans);
    if (finished > 0) o.parts.logger.info(`deleted ${finished} sub-agent session(s) whose parent was deleted`);
    return deleted + finished;
  };
  let running = false;
  const tick = () => {
    if (running) return;
    running = true;
    void sweep()
      .catch((err: unknown) => o.parts.logger.warn("retention sweep failed", { error: String(err) }))
      .finally(() => (running = false));
  };
  const timer = setInterval(tick, o.everyMs);
  timer.unref();
  // A deletion a crash cut short is finished at the next start, not an hour later.
  setImmediate(tick).unref();
  return { stop: () => clearInterval(timer), sweep };
}
