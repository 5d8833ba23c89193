// Sessions have an end. DeleteSession's work outside the log (memories when asked, schedules, the
// sandbox) is done here, and so is retention: an agent.json may say how many days an idle session
// is kept (retentionDays); a sweep (hourly by default) deletes the older ones as DeleteSession
// would, memories kept.
import type { MemoryService } from "../shared/gen/troupe/v1/memory_pb.js";
import type { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { identityMetadata } from "../shared/auth.js";
import type { Logger } from "../shared/log.js";
import type { ServiceClient } from "../shared/rpc.js";
import type { AgentConfigs } from "./agent-config.js";
import type { ScheduleStore } from "./schedule-files.js";
import type { SessionActor } from "./session-actor.js";
import type { SessionStore } from "./session-log.js";
import type { SessionRegistry } from "./session-registry.js";

const DAY_MS = 86_400_000;

export interface SessionParts {
  memory: ServiceClient<(typeof MemoryService)["method"]>;
  sandbox: ServiceClient<(typeof SandboxService)["method"]>;
  schedules: ScheduleStore;
  /** Called when schedules changed. Contract: never throws. */
  schedulesChanged(): void;
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

/** Deletes the sessions idle longer than their agent's retentionDays, every `everyMs`. */
export function startRetention(o: {
  store: SessionStore;
  registry: SessionRegistry;
  agents: AgentConfigs;
  parts: SessionParts;
  everyMs: number;
}): { stop(): void; sweep(): Promise<number> } {
  const sweep = async (): Promise<number> => {
    let deleted = 0;
    const now = Date.now();
    for (const s of await o.store.list()) {
      const days = (await o.agents.get(s.agentId)).config.retentionDays;
      if (days === undefined || now - s.updateMs < days * DAY_MS) continue;
      try {
        await o.registry.delete(s.sessionId, s.owner, (actor) =>
          clearSessionParts(o.parts, actor, false).then(() => undefined),
        );
        deleted++;
      } catch (err) {
        o.parts.logger.warn("retention: a session could not be deleted; trying again next sweep", {
          session: s.sessionId,
          error: String((err as Error).message ?? err),
        });
      }
    }
    if (deleted > 0) o.parts.logger.info(`retention: deleted ${deleted} idle session(s)`);
    return deleted;
  };
  let running = false;
  const timer = setInterval(() => {
    if (running) return;
    running = true;
    void sweep()
      .catch((err: unknown) => o.parts.logger.warn("retention sweep failed", { error: String(err) }))
      .finally(() => (running = false));
  }, o.everyMs);
  timer.unref();
  return { stop: () => clearInterval(timer), sweep };
}
