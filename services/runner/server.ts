// The runner process: RunnerService over the session actors, plus registration with the router
// so the gateway can find the runner that owns a session.
import { WorkspaceTemplates } from "./tools/workspace-templates.js";
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { context } from "@opentelemetry/api";
import {
  NAME,
  identityMetadata,
  identityOf,
  internalCredentials,
  internalServing,
  sameIdentity,
} from "../shared/auth/auth.js";
import type { Config } from "../shared/config/config-types.js";
import { modelBaseUrl } from "../shared/config/config.js";
import { invalidArgument, invalidArgumentIf } from "../shared/errors.js";
import { triggerFrameId, validateFrame } from "../shared/frames.js";
import { MemoryService } from "../shared/gen/troupe/v1/memory_pb.js";
import { RouterService } from "../shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../shared/gen/troupe/v1/runner_pb.js";
import { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { ClientFrameSchema, QueueMode, SessionInfoSchema } from "../shared/gen/troupe/v1/session_pb.js";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { Logger } from "../shared/process/log.js";
import type { RunningService } from "../shared/process/service.js";
import { RpcServer, createClient, type grpc, wrappedHandler } from "../shared/rpc.js";
import { contextFromRecord } from "../shared/process/telemetry.js";
import { DEFAULT_RECALL, MemoryRecall, learnAfterRuns } from "./memory/memory-recall.js";
import { LearningQueue } from "./memory/learning-queue.js";
import { loadProviders, singleProvider } from "../shared/models/providers.js";
import { registerWithRouter } from "./transport/registration.js";
import { adoptOrphans } from "./session/orphaned-runs.js";
import type { SessionRef } from "../shared/session-ref.js";
import { deleteSessionTree, startRetention, withoutOrphans } from "./retention.js";
import { ProviderModels } from "./providers/provider-models.js";
import type { SessionActor } from "./session/session-actor.js";
import { RUNNER_STORES } from "./store/registry.js";
import { storeKind } from "../shared/store-kind.js";
import { SessionRegistry } from "./session/session-registry.js";
import { AgentConfigs, egressGrant, sessionModel } from "./agent-config.js";
import { serversFor } from "./tools/mcp/mcp-config.js";
import { ContextSources } from "./loop/context.js";
import { Hooks, loadPlugins } from "./loop/hooks.js";
import { InboundSafety } from "./loop/safety.js";
import { ScheduleBook, Scheduler } from "./schedules/schedules.js";
import { TokenCounter } from "./loop/tokens.js";
import { TenantRuns } from "./session/tenant-runs.js";
import { configureFailpoints } from "./loop/failpoints.js";
import { runDepsFor } from "./loop/run-deps.js";
import { observeLearning, observeSessions } from "./runner-metrics.js";
import { operatorCalls } from "./transport/operator-calls.js";
import { attachManyHandler } from "./transport/attach-many.js";
import { attachHandler } from "./transport/attach-stream.js";
import { BackgroundProcesses } from "./tools/background.js";
import { McpHub } from "./tools/mcp/mcp-hub.js";
import { Secrets } from "./tools/web-tools.js";
import { DEFAULT_NET_POLICY } from "../shared/net/net-guard.js";
import { TenantQuotas } from "../shared/auth/quotas.js";
import { nextPageToken, pageOf } from "../shared/paging.js";
import { RpcError, Status } from "../shared/errors.js";

export async function startRunner(cfg: Config, logger: Logger): Promise<RunningService> {
  const listenTls = internalServing(cfg, "runner");
  configureFailpoints(cfg.failpoints);
  // Runners arbitrate sessions through their shared store (store/registry.ts): a data directory
  // (session-lease.ts) or PostgreSQL (pg-session-store.ts), where membership lives too.
  const self = { runnerId: cfg.runnerId, address: cfg.advertise, incarnation: randomUUID() };
  let lapsed = (_silentMs: number) => undefined as void;
  const storage = RUNNER_STORES[storeKind(cfg.storeUrl)]({
    url: cfg.storeUrl,
    dataDir: cfg.dataDir,
    self,
    livenessMs: cfg.runnerLivenessMs,
    damagedSchedule: (file) => logger.warn("a schedule file is empty or damaged; skipping it", { file }),
    trouble: (message) => logger.error(`store: ${message}`),
    lapsed: (ms) => lapsed(ms),
  });
  await storage.start();
  const store = storage.sessions;
  const model = new ProviderModels(
    cfg.providersFile
      ? loadProviders(cfg.providersFile)
      : singleProvider(modelBaseUrl(cfg), cfg.openaiApiKey, cfg.openaiAccount),
    logger,
  );
  const credentials = await internalCredentials(cfg.dataDir, cfg.internalToken, cfg.internalCa);
  const peer = { headers: credentials.headers, tls: credentials.tls };
  const sandbox = createClient(SandboxService, cfg.addr.sandbox, peer);
  const memory = createClient(MemoryService, cfg.addr.memory, peer);
  const recall = new MemoryRecall(memory, { ...DEFAULT_RECALL, k: cfg.memoryContextK }, logger);
  const learning = new LearningQueue(logger);
  observeLearning(learning);
  const learn = cfg.memoryLearn ? learnAfterRuns(memory, recall, learning, logger) : undefined;
  const router = createClient(RouterService, cfg.addr.router, peer);
  const audit = storage.audit;
  const hooks = new Hooks();
  await loadPlugins(hooks, cfg.hookModules);
  const safety = new InboundSafety(hooks.threatChecks);
  const agents = new AgentConfigs(cfg.agentsDir);
  const sources = new ContextSources(cfg.agentsDir, storage.profiles);
  // One counter per model, shared by its sessions: once one needs exact counts, all have them.
  const counters = new Map<string, TokenCounter>();
  const tokensFor = async (modelName: string) => {
    let c = counters.get(modelName);
    if (!c) counters.set(modelName, (c = TokenCounter.forModel(modelName)));
    return c;
  };
  const subagentsRunning = new Map<string, number>();
  const quotas = await new TenantQuotas(cfg.quotaDefaults, cfg.quotasFile).start((err) =>
    logger.error("quotas file rejected; keeping the quotas read before", {
      error: String((err as Error).message ?? err),
    }),
  );

  const book = new ScheduleBook(storage.schedules, cfg.minHeartbeatSeconds);
  const background = new BackgroundProcesses(sandbox);
  const secrets = new Secrets(cfg.secretsFile);
  const net = { ...DEFAULT_NET_POLICY, ...cfg.net, proxy: cfg.outboundProxy };
  const mcp = new McpHub({ net, secrets, sandbox });
  const templates = new WorkspaceTemplates(sandbox, logger, cfg.maxMessageBytes - 64 * 1024);
  const runDeps = runDepsFor({
    templates,
    defaultModel: cfg.model,
    execTimeoutMs: cfg.execTimeoutMs,
    sandboxScope: cfg.sandboxScope,
    workspacesKept: cfg.sandboxWorkspaces === "kept",
    net,
    secrets,
    background,
    mcp,
    // The scheduler starts below; a tool call can only come after it has.
    schedules: { book, changed: () => scheduler.changed() },
    model,
    sandbox,
    memory,
    recall,
    learn,
    agents,
    sources,
    hooks,
    safety,
    audit,
    logger,
    tokens: tokensFor,
    quotas,
    subagentsRunning,
    createChild: (childId, parent, sub) => registry.createChild(childId, parent, sub),
  });
  const registry = new SessionRegistry(
    { store, audit, logger, runDeps, runs: new TenantRuns(quotas) },
    {
      passivateAfterMs: cfg.passivateAfterMs,
      sessionsPerMinute: (tenant) => quotas.of(tenant).sessionsPerMinute,
      modelRefusal: async (agentId, m) =>
        sessionModel(agentId, (await agents.get(agentId)).config, cfg.model, m).refused,
    },
  );

  observeSessions(registry);

  // Silent past its lease, this runner may have lost any session: none is served from memory.
  lapsed = (ms) =>
    void registry
      .relinquishAll()
      .then((n) => logger.warn(`silent ${ms} ms, past the lease: ${n} sessions handed over`));

  /** Whether a session belongs here: it lives here, or the router places it here (or cannot say). */
  const placedHere = async (ref: SessionRef): Promise<boolean> => {
    if (registry.holds(ref)) return true;
    const placed = await router
      .resolveSession({ sessionId: ref.sessionId }, { timeoutMs: 2000, metadata: identityMetadata(ref) })
      .catch(() => undefined);
    return !placed?.runner || placed.runner.runnerId === cfg.runnerId;
  };

  // Scheduled tasks and heartbeats: each firing is a prompt the session takes once (see schedules.ts).
  const scheduler = new Scheduler(
    book,
    async (f) => {
      // The runner the router places the session on fires it (unless the session already lives here),
      // so a firing does not pull the session away from where its clients are sent.
      if (!(await placedHere(f.ref))) throw new Error(`session ${f.ref.sessionId} is placed on another runner`);
      // The schedule's own ref: it fires only into the session of the principal that made it.
      const actor = await registry.get(f.ref);
      if (!actor) {
        logger.warn("a schedule names a session that no longer exists; removing it", {
          session: f.ref.sessionId,
          schedule: f.scheduleId,
        });
        await book.remove(f.ref, f.scheduleId);
        return;
      }
      const frame = create(ClientFrameSchema, {
        frameId: triggerFrameId(f.kind, f.scheduleId, f.dueMs),
        kind: { case: "prompt", value: { text: f.text, queueMode: QueueMode.FOLLOWUP } },
      });
      await actor.submit(frame);
    },
    logger,
  );
  scheduler.start();
  // What a deleted session has outside its log (retention.ts), and the sweep of idle ones.
  const parts = {
    memory,
    sandbox,
    schedules: storage.schedules,
    schedulesChanged: () => scheduler.changed(),
    closeMcp: (ref: SessionRef) => mcp.closeSession(ref),
    logger,
  };
  const retention = startRetention({ store, registry, agents, parts, everyMs: cfg.retentionSweepMs });

  // Session calls come from the gateway with the client's verified identity; a session answers
  // only the tenant and principal that own it.
  const requireActor = (sessionId: string, call: { metadata: grpc.Metadata }): Promise<SessionActor> =>
    registry.require(sessionId, identityOf(call.metadata));

  const server = new RpcServer({
    maxMessageBytes: cfg.maxMessageBytes,
    authenticate: credentials.authenticate,
    logger,
  });
  const attach = attachHandler(registry);
  server.add(RunnerService, {
    // A session stream is a sub-stream of AttachMany, never a call of its own.
    // biome-ignore lint/correctness/useYield: refused before it would answer anything
    async *attach() {
      throw new RpcError(Status.UNIMPLEMENTED, "session streams are carried on AttachMany; Attach is not served alone");
    },
    // Sub-streams are Attach calls in all but transport: the same handler, wrapped as the server wraps it.
    attachMany: attachManyHandler(
      wrappedHandler(RunnerService.method.attach, attach as never, logger) as never,
      logger,
      cfg.maxMessageBytes,
    ),

    async describeMcpServers(req, call) {
      const who = identityOf(call.metadata);
      // A session's own connections (its agent's servers), or a probe's, removed after.
      const actor = req.sessionId ? await requireActor(req.sessionId, call) : undefined;
      const agentId = actor?.agentId ?? req.agentId;
      if (!actor && !req.probeId.startsWith("mcp-probe-")) throw invalidArgument("a probe needs a probe_id");
      const { config } = await agents.get(agentId);
      const sessionId = actor?.sessionId ?? req.probeId;
      const owner = actor?.owner ?? who;
      const statuses = await mcp.status(
        { sessionId, agentId, owner, egress: async () => egressGrant(config) },
        serversFor(config, owner.tenant),
      );
      if (!actor) {
        await mcp.closeSession({ tenant: owner.tenant, principal: owner.principal, sessionId });
        await sandbox
          .releaseSandbox({ sessionId, agentId }, { metadata: identityMetadata(owner), timeoutMs: 10_000 })
          .catch(() => undefined);
      }
      return { servers: statuses };
    },

    async ensureSession(req, call) {
      if (!req.open) throw invalidArgument("open is required");
      // The same checks as an open frame (session id, agent, model, reasoning effort): the caller is trusted, its input is not.
      validateFrame(
        create(ClientFrameSchema, { frameId: "ensure-session", kind: { case: "open", value: req.open } }),
        false,
      );
      invalidArgumentIf(
        req.memoryOwner !== "" && !NAME.test(req.memoryOwner),
        "memory_owner must be 1-128 of A-Z a-z 0-9 . _ : @ -",
      );
      const { opened } = await registry.open(req.open, identityOf(call.metadata), "", req.memoryOwner);
      return { session: opened };
    },

    async submit(req, call) {
      validateFrame(req.frame, true);
      const actor = await requireActor(req.sessionId, call);
      const traceContext =
        Object.keys(req.frame.traceContext).length > 0 ? contextFromRecord(req.frame.traceContext) : context.active();
      return { accepted: await actor.submit(req.frame, traceContext) };
    },

    async readHistory(req, call) {
      const page = pageOf(req.pageSize, req.pageToken);
      const actor = await requireActor(req.sessionId, call);
      // Images without their bytes: a page of messages must fit one gRPC message.
      const messages = (await actor.historyPage(page.offset, page.size)).map((m) =>
        m.images.length === 0 ? m : { ...m, images: m.images.map((i) => ({ ...i, data: new Uint8Array() })) },
      );
      return { messages, nextPageToken: nextPageToken(page, actor.history.length) };
    },

    async listStoredSessions(req, call) {
      const page = pageOf(req.pageSize, req.pageToken);
      const caller = identityOf(call.metadata);
      const live = new Map(
        (await registry.loaded()).filter((a) => sameIdentity(a.owner, caller)).map((a) => [a.sessionId, a]),
      );
      // A sub-agent's session whose parent is gone is gone too (retention.ts).
      const stored = withoutOrphans(await store.list(caller)).sort((a, b) => a.sessionId.localeCompare(b.sessionId));
      const sessions = stored.slice(page.offset, page.offset + page.size).map(
        (s) =>
          live.get(s.sessionId)?.info() ??
          create(SessionInfoSchema, {
            sessionId: s.sessionId,
            agentId: s.agentId,
            createTime: timestampFromMs(s.createdMs),
            updateTime: timestampFromMs(s.updateMs),
          }),
      );
      return { sessions, nextPageToken: nextPageToken(page, stored.length) };
    },

    async getRunnerStats(req) {
      const actors = await registry.loaded();
      const gc = (globalThis as { gc?: () => void }).gc;
      if (req.collectGarbage && gc) gc();
      const mem = process.memoryUsage();
      return {
        runnerId: cfg.runnerId,
        liveSessions: actors.length,
        runningSessions: actors.filter((a) => a.running).length,
        heapUsedBytes: BigInt(mem.heapUsed),
        rssBytes: BigInt(mem.rss),
        garbageCollected: req.collectGarbage && gc !== undefined,
      };
    },

    async passivateIdle(req) {
      return { passivated: await registry.passivateIdle(req.idleForMs) };
    },

    async deleteStoredSession(req, call) {
      return deleteSessionTree(
        { store, registry, parts },
        req.sessionId,
        identityOf(call.metadata),
        req.forgetMemories,
      );
    },

    async putSchedule(req, call) {
      if (!req.schedule) throw invalidArgument("schedule is required");
      const actor = await requireActor(req.schedule.sessionId, call);
      const schedule = await book.put(actor.ref, req.schedule, quotas.of(actor.ref.tenant).schedulesPerSession);
      scheduler.changed();
      return { schedule };
    },

    async readSchedules(req, call) {
      const actor = await requireActor(req.sessionId, call);
      return { schedules: book.list(await book.read(actor.ref)) };
    },

    async removeSchedule(req, call) {
      const actor = await requireActor(req.sessionId, call);
      const deleted = await book.remove(actor.ref, req.scheduleId);
      scheduler.changed();
      return { deleted };
    },

    ...operatorCalls(audit, sandbox, cfg.runnerId),
  });

  const port = await server.listen(cfg.addr.runner, listenTls);
  logger.info(`runner ${cfg.runnerId} serving on port ${port}`, {
    model: cfg.model,
    providers: [...model.providers.byName.values()].map((p) => `${p.name} (${p.kind}) ${p.baseUrl}`).join(", "),
  });
  // On PostgreSQL the routers read membership from the store (the heartbeat); on files they are told.
  const registration =
    storage.membership === "store"
      ? { stop: () => storage.drain() }
      : registerWithRouter(router, cfg.runnerId, cfg.advertise, logger);
  // What a runner process that died was in the middle of goes on here, if placed here (orphaned-runs.ts).
  const orphans = adoptOrphans({
    store: storage.sessions,
    placedHere,
    load: (ref) => registry.get(ref),
    logger,
    // Past a dead runner's lease its sessions are free; a sweep or two later they are taken.
    everyMs: Math.max(5000, 2 * cfg.runnerLivenessMs),
  });

  return {
    // SIGTERM: leave the router's list, let the runs going finish within the grace while their
    // streams still carry them, then end the streams and hand over what is left (the next load
    // of each such session, here or on another runner, resumes its run).
    async drain() {
      orphans.stop();
      scheduler.stop();
      retention.stop();
      background.stopAll();
      await mcp.stop();
      quotas.stop();
      await registration.stop();
      const started = Date.now();
      await registry.drain(cfg.drainGraceMs);
      const unlearned = learning.close();
      if (unlearned > 0) logger.info("stopping: turns still waiting to be learned from are not", { turns: unlearned });
      // The runs are over (or out of time): streams would wait for clients that never hang up, so
      // calls get at most a second more; clients reconnect to the runner that takes over.
      await server.drain(Math.min(1000, Math.max(0, cfg.drainGraceMs - (Date.now() - started))));
      await registry.close();
      await storage.stop();
      await model.close();
      for (const c of [sandbox, memory, router]) c.close();
      // Last: a stream still open learns only now, when its session is free for the next runner.
      await server.close();
    },
  };
}
