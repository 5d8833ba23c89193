// The runner's live actors, by session id. An actor is created on first use (or loaded from its
// log) exactly once, however many calls ask for it at the same time.
import { create } from "@bufbuild/protobuf";
import { SessionOpenedSchema, type OpenSession, type SessionOpened } from "../shared/gen/troupe/v1/session_pb.js";
import { notFound } from "../shared/errors.js";
import { validateSessionRef } from "../shared/frames.js";
import { DEFAULT_AGENT, newId } from "../shared/ids.js";
import { SessionActor, type ActorDeps } from "./session-actor.js";

export class SessionRegistry {
  private readonly actors = new Map<string, Promise<SessionActor>>();

  constructor(private readonly deps: ActorDeps) {}

  /** The live actor of a stored session, loading it if needed; undefined if no such session. */
  async get(sessionId: string): Promise<SessionActor | undefined> {
    validateSessionRef(sessionId, "", false);
    const live = this.actors.get(sessionId);
    if (live) return live;
    if (!(await this.deps.store.exists(sessionId))) return undefined;
    return this.remember(sessionId, () => SessionActor.load(sessionId, this.deps));
  }

  /** Opens a session for a client: finds it, or creates it when asked to. */
  async open(open: OpenSession, frameId = ""): Promise<{ actor: SessionActor; opened: SessionOpened }> {
    validateSessionRef(open.sessionId, open.agentId, true);
    const sessionId = open.sessionId || newId();
    let actor = await this.get(sessionId);
    let created = false;
    if (!actor) {
      if (open.sessionId !== "" && !open.create) throw notFound(`session ${sessionId} does not exist (set create to make it)`);
      const agentId = open.agentId || DEFAULT_AGENT;
      actor = await this.remember(sessionId, () =>
        SessionActor.create(sessionId, agentId, this.deps).catch((err: NodeJS.ErrnoException) => {
          // Someone else created it between our check and our create: use theirs.
          if (err.code === "EEXIST") return SessionActor.load(sessionId, this.deps);
          throw err;
        }),
      );
      created = true;
    }
    await actor.setQueueMode(open.queueMode);
    const opened = create(SessionOpenedSchema, { sessionId, agentId: actor.agentId, lastSeq: BigInt(actor.lastSeq), created, frameId });
    return { actor, opened };
  }

  /** Loaded actors, for listing. */
  async loaded(): Promise<SessionActor[]> {
    const settled = await Promise.allSettled(this.actors.values());
    return settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  }

  private remember(sessionId: string, make: () => Promise<SessionActor>): Promise<SessionActor> {
    const existing = this.actors.get(sessionId);
    if (existing) return existing;
    const p = make();
    this.actors.set(sessionId, p);
    p.catch(() => this.actors.delete(sessionId));
    return p;
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.actors.values()].map(async (p) => (await p).close()));
    this.actors.clear();
  }
}
