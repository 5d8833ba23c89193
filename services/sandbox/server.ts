// The sandbox service: untrusted tool code in hardened containers (fleet.ts), run by the agent
// inside each one (agent-connection.ts). This file is the gRPC face: it validates requests, maps
// them to a sandbox by scope key, and turns what the agent reports into statuses a caller can act
// on; a command's output streams back by exec-stream.ts.
//
// Every process in a sandbox runs as one unprivileged user, the agent included; the agent's
// kill(-1) therefore reaches every process a command started, however it forked, detached or
// masked signals, and needs no new process to do it. An agent that does not answer is not
// trusted to: after KILL_TIMEOUT_MS its container is removed instead.
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { identityOf, internalCredentials, internalServing } from "../shared/auth/auth.js";
import type { Config } from "../shared/config/config-types.js";
import { failedPrecondition, grpcCode, invalidArgumentIf, notFound, Status, unavailable } from "../shared/errors.js";
import { instruments } from "../shared/process/metrics.js";
import { FileType, SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { DEFAULT_AGENT, isAgentId, isSessionId } from "../shared/ids.js";
import { TenantQuotas } from "../shared/auth/quotas.js";
import { RateLimited } from "../shared/auth/rate.js";
import { scopeKey as sandboxScopeKey, tenantOfScopeKey } from "./scope.js";
import type { Logger } from "../shared/process/log.js";
import { RpcServer, ServingStatus, type grpc } from "../shared/rpc.js";
import type { RunningService } from "../shared/process/service.js";
import { AgentError, AgentGone, within } from "./agent-connection.js";
import path from "node:path";
import { SandboxFleet, type Sandbox } from "./fleet.js";
import { WorkspaceSaves } from "./workspaces/workspace-saves.js";
import { WorkspaceUsage } from "./workspaces/workspace-usage.js";
import { Snapshots } from "./workspaces/snapshots.js";
import { snapshotStoreOf } from "./workspaces/snapshot-stores.js";
import { snapshotCalls } from "./workspaces/snapshot-calls.js";
import { AgentTemplates } from "./workspaces/templates.js";
import { execHandler, type RunningCommand } from "./exec-stream.js";
import { EgressProxy } from "./egress-proxy.js";
import { Engine, engineAddress } from "./engine.js";
import { DEFAULT_NET_POLICY } from "../shared/net/net-guard.js";
import { DEFAULT_LIMITS, instanceOf } from "./container-spec.js";
import {
  DEFAULT_LIST_ENTRIES,
  DEFAULT_READ_BYTES,
  MAX_LIST_ENTRIES,
  MAX_STDIN_WRITE,
  SIGNALS,
  agentStatus,
  workspacePath,
} from "./requests.js";

const KILL_TIMEOUT_MS = 3000;
const FILE_OP_TIMEOUT_MS = 15_000;

export async function startSandbox(cfg: Config, logger: Logger): Promise<RunningService> {
  const listenTls = internalServing(cfg, "sandbox service");
  const docker = new Engine(engineAddress(cfg));
  const instance = instanceOf(cfg.dataDir);
  const egress = new EgressProxy(
    { ...DEFAULT_NET_POLICY, ports: cfg.net.ports, allow: cfg.net.allow, proxy: cfg.outboundProxy },
    logger,
  );
  const quotas = await new TenantQuotas(cfg.quotaDefaults, cfg.quotasFile).start((err) =>
    logger.error("quotas file rejected; keeping the quotas read before", {
      error: String((err as Error).message ?? err),
    }),
  );
  // Saved workspaces and snapshots, counted together in each tenant's workspace quota.
  const usage = new WorkspaceUsage();
  const quotaOf = (tenant: string) => quotas.of(tenant).workspaceMegabytes * 1024 * 1024;
  const saves =
    cfg.sandboxWorkspaces === "kept"
      ? new WorkspaceSaves(path.join(cfg.dataDir, "workspaces"), DEFAULT_LIMITS.workspaceBytes, logger, usage, quotaOf)
      : undefined;
  const snapshots = new Snapshots(
    snapshotStoreOf(cfg.sandboxSnapshots, { dataDir: cfg.dataDir, logger }),
    usage,
    quotaOf,
    logger,
  );
  const templates = new AgentTemplates(
    path.join(cfg.dataDir, "templates"),
    cfg.sandboxImage,
    cfg.sandboxImages,
    cfg.maxMessageBytes - 64 * 1024,
    logger,
  );
  await Promise.all([saves?.load(), templates.load()]);
  // A bucket that cannot be read yet leaves commands served; snapshot calls try it again.
  snapshots
    .ready()
    .catch((err) =>
      logger.error("snapshot store not readable yet", { store: snapshots.where, error: String(err.message ?? err) }),
    );
  /** What a new sandbox for a request's agent is made from (its template; a snapshot one in the caller's tenant). */
  const startOf = (req: { agentId: string }, call: { metadata: grpc.Metadata }) =>
    templates.of(req.agentId || DEFAULT_AGENT, (id) =>
      snapshots
        .get(identityOf(call.metadata).tenant, id)
        .then((s) => snapshots.archiveOf(s))
        // Not the tenant's: it starts empty and is told so. A store that cannot be read is told as that.
        .catch((err) => {
          if (grpcCode(err) === Status.NOT_FOUND) return undefined;
          throw err;
        }),
    );
  const fleet = new SandboxFleet(
    docker,
    {
      image: cfg.sandboxImage,
      runtime: cfg.sandboxRuntime,
      instance,
      limits: DEFAULT_LIMITS,
      poolSize: cfg.sandboxPoolSize,
      idleMs: cfg.sandboxIdleMs,
      maxAgeMs: cfg.sandboxMaxAgeMs,
    },
    logger,
    (socket, agent) => egress.serve(socket, agent.claimedFor, agent.egress),
    saves,
    { allowed: templates.images, pooled: () => templates.usedImages() },
  );
  instruments()
    .meter.createObservableGauge("troupe.sandboxes", { description: "sandboxes of this service, claimed and pooled" })
    .addCallback((g) => {
      g.observe(fleet.claimed, { "troupe.sandbox.state": "claimed" });
      g.observe(fleet.pooled, { "troupe.sandbox.state": "pooled" });
    });
  const server = new RpcServer({
    maxMessageBytes: cfg.maxMessageBytes,
    authenticate: (await internalCredentials(cfg.dataDir, cfg.internalToken)).authenticate,
    logger,
  });
  const engineHint = `no Docker engine reachable at ${docker.name}: start dockerd (or set DOCKER_HOST or DOCKER_CONTEXT) and retry`;
  let engineUp = false;

  const checkEngine = async () => {
    const up = await docker.ping().then(
      () => true,
      () => false,
    );
    if (up !== engineUp) {
      engineUp = up;
      server.setStatus(SandboxService.typeName, up ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
      server.setStatus("", up ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
      if (up) {
        logger.info("Docker engine reachable");
        fleet.fill();
      } else logger.error(engineHint);
    }
    // Each check: the engine's event stream ends when the engine restarts; watch again.
    if (up) await fleet.watch();
    return up;
  };
  const requireEngine = async () => {
    if (!(engineUp || (await checkEngine()))) throw unavailable(engineHint);
  };

  /**
   * A request that would make the key a new sandbox, from a tenant at its quota of live sandboxes,
   * is refused (RESOURCE_EXHAUSTED, retry once one is released or reaped). Counted over the
   * sandboxes this process holds.
   */
  const requireRoom = (key: string, call: { metadata: grpc.Metadata }) => {
    // Every command asks: a key that has its sandbox is answered without a look at the others.
    if (fleet.held.has(key)) return;
    const { tenant } = identityOf(call.metadata);
    const limit = quotas.of(tenant).liveSandboxes;
    const owner = tenantOfScopeKey(key);
    let mine = 0;
    for (const k of fleet.held.keys()) if (tenantOfScopeKey(k) === owner) mine++;
    if (mine >= limit)
      throw new RateLimited(
        `tenant ${tenant} has ${mine} live sandboxes, its quota; release one (or let it idle out) first`,
        5000,
        "QUOTA_EXCEEDED",
      );
  };

  /** Whose sandbox a request is for (scope.ts): its owner is named in the call's metadata by the runner. */
  const scopeKey = (req: { sessionId: string; agentId: string }, call: { metadata: grpc.Metadata }): string => {
    invalidArgumentIf(!isSessionId(req.sessionId), "session_id is missing or malformed");
    invalidArgumentIf(req.agentId !== "" && !isAgentId(req.agentId), "agent_id is malformed");
    return sandboxScopeKey(cfg.sandboxScope, identityOf(call.metadata), req.sessionId, req.agentId);
  };

  /**
   * Kills every command in the sandbox; if its agent does not confirm in time, removes the
   * container instead (which ends everything in it, workspace included).
   */
  const killAll = async (sandbox: Sandbox) => {
    try {
      await within(sandbox.agent.killAll(), KILL_TIMEOUT_MS, () => new Error("no answer"));
    } catch (err) {
      await fleet.discard(sandbox, `its agent did not confirm a kill (${(err as Error).message})`);
    }
  };

  /** Running commands by the id the caller got, for SignalExec. */
  const running = new Map<string, RunningCommand>();

  /** A file request: the key's sandbox, the agent's answer within a deadline, errors as statuses. */
  const fileOp = async <T>(
    req: { sessionId: string; agentId: string },
    call: { metadata: grpc.Metadata },
    what: string,
    op: (sandbox: Sandbox) => Promise<T>,
  ): Promise<T> => {
    const key = scopeKey(req, call);
    await requireEngine();
    requireRoom(key, call);
    const sandbox = await fleet.get(key, () => startOf(req, call));
    sandbox.lastUsed = Date.now();
    try {
      fleet.used(sandbox, identityOf(call.metadata).tenant);
      return await within(
        op(sandbox),
        FILE_OP_TIMEOUT_MS,
        () => new AgentGone(`no answer within ${FILE_OP_TIMEOUT_MS} ms`),
      );
    } catch (err) {
      if (err instanceof AgentGone && sandbox.agent.alive) await fleet.discard(sandbox, `${what} went unanswered`);
      throw agentStatus(err, what);
    }
  };

  server.add(SandboxService, {
    ...snapshotCalls({
      fleet,
      snapshots,
      saves,
      usage,
      quotaOf,
      workspaceBytes: DEFAULT_LIMITS.workspaceBytes,
      scopeKey,
      requireEngine,
    }),
    exec: execHandler({
      fleet,
      running,
      execTimeoutMs: cfg.execTimeoutMs,
      killTimeoutMs: KILL_TIMEOUT_MS,
      scopeKey,
      startOf,
      requireEngine,
      requireRoom,
      killAll,
    }),

    async putTemplate(req) {
      const changed = await templates.put(req.agentId, req.image, req.files, req.filesSha256, req.snapshotId);
      // A new image's pool starts filling now, before its first session asks.
      if (changed) fleet.fill();
      return { changed };
    },

    async writeStdin(req, call) {
      const key = scopeKey(req, call);
      invalidArgumentIf(req.data.length > MAX_STDIN_WRITE, `data must be at most ${MAX_STDIN_WRITE} bytes`);
      const target = running.get(req.execId);
      // Another scope's command is as unknown to the caller as a finished one.
      if (!target || target.key !== key) throw notFound(`no running command ${req.execId} in this sandbox`);
      if (!target.stdinOpen) throw failedPrecondition(`the stdin of ${req.execId} is closed`);
      if (req.data.length > 0) target.exec.writeStdin(req.data);
      if (req.close) {
        target.stdinOpen = false;
        target.exec.closeStdin();
      }
      return {};
    },

    async signalExec(req, call) {
      const key = scopeKey(req, call);
      const signo = SIGNALS[req.signal];
      invalidArgumentIf(
        signo === undefined,
        "signal is missing or not one of HANGUP, INTERRUPT, QUIT, KILL, TERMINATE",
      );
      const target = running.get(req.execId);
      // Another scope's command is as unknown to the caller as a finished one.
      if (!target || target.key !== key) throw notFound(`no running command ${req.execId} in this sandbox`);
      try {
        await within(target.exec.signal(signo!), KILL_TIMEOUT_MS, () => new AgentGone("no answer"));
      } catch (err) {
        if (err instanceof AgentError && err.errno === 3) throw notFound(`command ${req.execId} has ended`);
        throw agentStatus(err, "signal");
      }
      return {};
    },

    async killProcesses(req, call) {
      const key = scopeKey(req, call);
      await requireEngine();
      const sandbox = await fleet.find(key);
      if (!sandbox) return { sandboxFound: false };
      await killAll(sandbox);
      return { sandboxFound: true };
    },

    async readFile(req, call) {
      const path = workspacePath(req.path, false);
      const max = Math.min(req.maxBytes || DEFAULT_READ_BYTES, cfg.maxMessageBytes - 64 * 1024);
      const file = await fileOp(req, call, `read ${req.path}`, (s) => s.agent.readFile(path, max));
      return { data: file.data, size: BigInt(file.size), truncated: file.truncated };
    },

    async writeFile(req, call) {
      const path = workspacePath(req.path, false);
      invalidArgumentIf(req.mode > 0o7777, "mode must be permission bits, at most 0o7777");
      invalidArgumentIf((req.mode & 0o7000) !== 0, "setuid, setgid and sticky bits are not allowed");
      await fileOp(req, call, `write ${req.path}`, (s) =>
        s.agent.writeFile(path, req.data, { mode: req.mode, createParents: req.createParents }),
      );
      return { bytesWritten: BigInt(req.data.length) };
    },

    async listFiles(req, call) {
      const path = workspacePath(req.path, true);
      invalidArgumentIf(req.maxEntries > MAX_LIST_ENTRIES, `max_entries must be at most ${MAX_LIST_ENTRIES}`);
      const listing = await fileOp(req, call, `list ${req.path || "/workspace"}`, (s) =>
        s.agent.list(path, req.maxEntries || DEFAULT_LIST_ENTRIES),
      );
      const types = {
        file: FileType.FILE,
        directory: FileType.DIRECTORY,
        symlink: FileType.SYMLINK,
        other: FileType.OTHER,
      };
      return {
        truncated: listing.truncated,
        entries: listing.entries
          .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
          .map((e) => ({
            name: e.name,
            type: types[e.type],
            size: BigInt(e.size),
            modifyTime: timestampFromMs(e.mtimeMs),
          })),
      };
    },

    async releaseSandbox(req, call) {
      const key = scopeKey(req, call);
      await requireEngine();
      return { removed: await fleet.release(key) };
    },

    async listSandboxes() {
      await requireEngine();
      const list = await fleet.list();
      return {
        sandboxes: list.map((s) => ({
          containerId: s.containerId,
          name: s.name,
          scopeKey: s.scopeKey,
          state: s.state,
          createTime: timestampFromMs(s.createdAt),
          lastUseTime: s.lastUsed === undefined ? undefined : timestampFromMs(s.lastUsed),
          pooled: s.pooled,
          runningCommands: s.runningCommands,
          runtime: cfg.sandboxRuntime,
          image: s.image,
        })),
      };
    },
  });

  await checkEngine();
  if (!engineUp) {
    // checkEngine only logs on a change; say it once at start as well.
    server.setStatus(SandboxService.typeName, ServingStatus.NOT_SERVING);
    server.setStatus("", ServingStatus.NOT_SERVING);
    logger.error(`${engineHint}; tools will fail until dockerd runs`);
  }
  const watch = setInterval(() => void checkEngine(), 5000);
  watch.unref();
  const reap = () =>
    engineUp ? fleet.reap().catch((err: Error) => logger.warn("reaper failed", { error: err.message })) : undefined;
  await reap();
  const reaper = setInterval(() => void reap(), Math.max(500, Math.min(60_000, cfg.sandboxIdleMs / 4)));
  reaper.unref();
  const port = await server.listen(cfg.addr.sandbox, listenTls);
  logger.info(`sandbox serving on port ${port}`, {
    image: cfg.sandboxImage,
    runtime: cfg.sandboxRuntime,
    instance,
    pool: cfg.sandboxPoolSize,
    scope: cfg.sandboxScope,
  });
  return {
    async drain() {
      clearInterval(watch);
      clearInterval(reaper);
      quotas.stop();
      await server.drain(cfg.drainGraceMs);
      await fleet.shutdown();
      docker.close();
      await server.close();
    },
  };
}
