// The runner's live actors, by session ref (owner and id: session-ref.ts). An actor is created on
// first use (or loaded from its log) exactly once, however many calls ask for it at the same time.
// A caller only ever names sessions under its own identity, so another owner's session is one
// that does not exist for it: NOT_FOUND, the same answer by the same path as a missing one.
import { SessionElsewhere } from "./session-lease.js";
import { create } from "@bufbuild/protobuf";
import { SessionOpenedSchema, type OpenSession, type SessionOpened } from "../../shared/gen/troupe/v1/session_pb.js";
import { sameIdentity, type Identity } from "../../shared/auth/auth.js";
import { invalidArgument, notFound, unavailable } from "../../shared/errors.js";
import { Buckets } from "../../shared/auth/rate.js";
import { validateSessionRef } from "../../shared/frames.js";
import { DEFAULT_AGENT, newId } from "../../shared/ids.js";
import { SessionActor, type ActorDeps } from "./session-actor.js";
import type { Subagent } from "./session-log.js";
import { refKey, refOf, type SessionRef } from "../../shared/session-ref.js";

export interface RegistryOptions {
  /** Actors with nothing to do for this long leave memory; they are reloaded from their log. */
  passivateAfterMs: number;
  /** New sessions a tenant may make a minute (quotas.ts, sessionsPerMinute); none: no quota. */
  sessionsPerMinute?: (tenant: string) => number;
  /** Why an agent's sessions may not choose this model (agent-config.ts, sessionModel); undefined: they may. */
  modelRefusal?: (agentId: string, model: string) => Promise<string | undefined>;
}

export class SessionRegistry {
  private readonly actors = new Map<string, Promise<SessionActor>>();
  /** Sessions leaving memory right now: a load waits until their log is flushed and closed. */
  private readonly leaving = new Map<string, Promise<void>>();
  private readonly sweeper: NodeJS.Timeout;
  private readonly creations = new Buckets();
  /** Set by drain(): no session is loaded or made here any more. */
  private draining = false;

  constructor(
    private readonly deps: ActorDeps,
    private readonly options: RegistryOptions = { passivateAfterMs: 600_000 },
  ) {
    this.sweeper = setInterval(
      () => void this.passivateIdle(),
      Math.max(50, Math.min(30_000, options.passivateAfterMs / 2)),
    );
    this.sweeper.unref();
  }

  /**
   * Evicts the actors that have been passivatable for at least `idleForMs` (by default the
   * configured time). Resolves with how many left, once their logs are closed.
   */
  async passivateIdle(idleForMs = this.options.passivateAfterMs): Promise<number> {
    const now = Date.now();
    const closing: Promise<void>[] = [];
    for (const [id, p] of [...this.actors]) {
      const actor = await p.catch(() => undefined);
      if (!actor || this.actors.get(id) !== p || !actor.passivatable || now - actor.lastActiveMs < idleForMs) continue;
      this.actors.delete(id);
      const closed = actor.close().finally(() => this.leaving.delete(id));
      this.leaving.set(id, closed);
      closing.push(closed);
      this.deps.logger.debug(`passivated session ${actor.sessionId}`, {
        tenant: actor.owner.tenant,
        principal: actor.owner.principal,
      });
    }
    await Promise.allSettled(closing);
    return closing.length;
  }

  /** How many actors are in memory. */
  get size(): number {
    return this.actors.size;
  }

  /**
   * The caller's session `sessionId`, live: NOT_FOUND if the caller has no such session. A
   * sub-agent's session whose parent is gone (a deletion cut short) is gone too: NOT_FOUND, as
   * a missing one, until the sweep removes it (retention.ts).
   */
  async require(sessionId: string, caller: Identity): Promise<SessionActor> {
    const actor = await this.get(refOf(caller, sessionId));
    if (!actor || (await this.orphaned(actor))) throw notFound(`session ${sessionId} does not exist`);
    return authorize(actor, caller);
  }

  /** A sub-agent's session whose parent no longer exists. */
  private async orphaned(actor: SessionActor): Promise<boolean> {
    const parent = actor.subagent?.parentSessionId;
    return parent !== undefined && !(await this.deps.store.exists(refOf(actor.owner, parent)));
  }

  /** The live actor of a stored session, loading it if needed; undefined if no such session. */
  async get(ref: SessionRef): Promise<SessionActor | undefined> {
    validateSessionRef(ref.sessionId, "", false);
    const key = refKey(ref);
    const live = this.actors.get(key);
    if (live) return live;
    await this.leaving.get(key);
    const again = this.actors.get(key);
    if (again) return again;
    if (!(await this.deps.store.exists(ref))) return undefined;
    return this.remember(ref, () => SessionActor.load(ref, this.deps));
  }

  private async checkModel(agentId: string, model: string): Promise<void> {
    const refused = model === "" ? undefined : await this.options.modelRefusal?.(agentId, model);
    if (refused) throw invalidArgument(refused);
  }

  /** Opens a session for a client: finds it (if it is the caller's), or creates it for the caller when asked to. */
  async open(
    open: OpenSession,
    caller: Identity,
    frameId = "",
    memoryOwner = "",
  ): Promise<{ actor: SessionActor; opened: SessionOpened }> {
    validateSessionRef(open.sessionId, open.agentId, true);
    const sessionId = open.sessionId || newId();
    const ref = refOf(caller, sessionId);
    let actor = await this.get(ref);
    if (actor && (await this.orphaned(actor))) throw notFound(`session ${sessionId} does not exist`);
    let created = false;
    if (!actor) {
      if (open.sessionId !== "" && !open.create)
        throw notFound(`session ${sessionId} does not exist (set create to make it)`);
      const agentId = open.agentId || DEFAULT_AGENT;
      await this.checkModel(agentId, open.model);
      const perMinute = this.options.sessionsPerMinute?.(caller.tenant);
      if (perMinute)
        this.creations.take(
          caller.tenant,
          perMinute / 60,
          perMinute,
          `tenant ${caller.tenant} is over its quota of ${perMinute} new sessions a minute`,
        );
      const owner = memoryOwner
        ? { tenant: caller.tenant, principal: caller.principal, memoryOwner }
        : { tenant: caller.tenant, principal: caller.principal };
      actor = await this.remember(ref, () =>
        SessionActor.create(sessionId, agentId, owner, this.deps).catch((err: NodeJS.ErrnoException) => {
          // Someone else created it between our check and our create: use theirs.
          if (err.code === "EEXIST") return SessionActor.load(ref, this.deps);
          throw err;
        }),
      );
      created = true;
    }
    authorize(actor, caller);
    if (!created) await this.checkModel(actor.agentId, open.model);
    await actor.settle(open);
    await actor.seed(open.history);
    const opened = create(SessionOpenedSchema, {
      sessionId,
      agentId: actor.agentId,
      lastSeq: BigInt(actor.lastSeq),
      created,
      frameId,
      model: actor.choices.model,
      reasoningEffort: actor.choices.reasoningEffort,
      queueMode: actor.queueMode,
      queued: actor.waiting,
      running: actor.running,
      usage: actor.history.usage(),
      messageCount: actor.history.length,
      messagesInContext: actor.history.length - actor.choices.contextFrom,
    });
    return { actor, opened };
  }

  /**
   * Deletes the caller's session `sessionId` (NOT_FOUND if they have none): its actor stops (a run
   * going is aborted), `before` clears what lives elsewhere (a failure there keeps the log, so the
   * call can be retried), then the log goes. Meanwhile the session is neither found nor loaded.
   */
  async delete(sessionId: string, caller: Identity, before: (actor: SessionActor) => Promise<void>): Promise<void> {
    // Not require(): a sub-agent's session whose parent is gone must still be deletable.
    const actor = await this.get(refOf(caller, sessionId));
    if (!actor) throw notFound(`session ${sessionId} does not exist`);
    authorize(actor, caller);
    const key = refKey(actor.ref);
    const deleting = (async () => {
      await actor.close();
      if (this.actors.get(key) !== undefined) this.actors.delete(key);
      await before(actor);
      await this.deps.store.remove(actor.ref);
    })();
    this.leaving.set(
      key,
      deleting.catch(() => undefined),
    );
    try {
      await deleting;
    } finally {
      this.leaving.delete(key);
    }
  }

  /** A sub-agent's session (delegate_task): created for the parent's owner, never found by another. */
  createChild(sessionId: string, parent: SessionActor, subagent: Subagent): Promise<SessionActor> {
    return this.remember(refOf(parent.owner, sessionId), () =>
      SessionActor.create(sessionId, parent.agentId, parent.owner, this.deps, subagent),
    );
  }

  /** The session is live in this runner (or being loaded here). */
  holds(ref: SessionRef): boolean {
    return this.actors.has(refKey(ref));
  }

  /** Loaded actors, for listing. */
  async loaded(): Promise<SessionActor[]> {
    const settled = await Promise.allSettled(this.actors.values());
    return settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  }

  /**
   * The first half of a shutdown (SIGTERM): no session is loaded or made here from now on
   * (UNAVAILABLE: the caller goes to another runner), no new run starts, and the runs going may
   * finish, for at most `graceMs`. close() then hands over what is still running.
   */
  async drain(graceMs: number): Promise<void> {
    this.draining = true;
    const actors = await this.loaded();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled(actors.map((a) => a.drain())),
      new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs))),
    ]);
    clearTimeout(timer);
  }

  /**
   * This runner was silent past its lease (paused, cut off from the store): others may have taken
   * any of its sessions, so none is served from memory any more; each is loaded again on its next
   * call, here or, if taken, at its new owner.
   */
  async relinquishAll(): Promise<number> {
    const actors = [...this.actors.values()];
    this.actors.clear();
    await Promise.allSettled(
      actors.map(async (p) => {
        const actor = await p;
        const moved = new SessionElsewhere(`session ${actor.sessionId} moved: this runner's lease lapsed`);
        await actor.close({ handOver: true, end: moved });
      }),
    );
    return actors.length;
  }

  private remember(ref: SessionRef, make: () => Promise<SessionActor>): Promise<SessionActor> {
    const key = refKey(ref);
    const existing = this.actors.get(key);
    if (existing) return existing;
    if (this.draining) throw unavailable("this runner is shutting down; retry: the session is served elsewhere");
    const p = make();
    this.actors.set(key, p);
    const forget = () => {
      if (this.actors.get(key) === p) this.actors.delete(key);
    };
    p.then((actor) => (actor.onLost = forget), forget);
    return p;
  }

  async close(): Promise<void> {
    clearInterval(this.sweeper);
    this.creations.stop();
    await Promise.allSettled(this.leaving.values());
    // A run still going is handed over, not ended: the next load (here or elsewhere) resumes it,
    // and its session stays held by this process, which is about to go, so the next runner's
    // sweep for orphans (or this runner's, restarted) makes that load with no client asking.
    await Promise.allSettled(
      [...this.actors.values()].map(async (p) => (await p).close({ handOver: true, exiting: true })),
    );
    this.actors.clear();
  }
}

/** Defence in depth: the ref already names the caller, so this holds unless a log lies about its owner. */
function authorize(actor: SessionActor, caller: Identity): SessionActor {
  if (!sameIdentity(actor.owner, caller)) throw notFound(`session ${actor.sessionId} does not exist`);
  return actor;
}
