// The gateway: Troupe's public gRPC face. It validates what clients send, asks the router once per
// session which runner owns it (and caches the answer), then connects the client's stream straight
// to that runner. Events flow runner -> gateway -> client with backpressure honoured at each step;
// the router is never on that path.
import { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { workspaceSnapshotCalls } from "./workspace-snapshots.js";
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import {
  apiKeyAuth,
  callerOf,
  identityMetadata,
  identityOf,
  internalCredentials,
  onBehalfOf,
} from "../shared/auth/auth.js";
import { NAME } from "../shared/auth/api-keys.js";
import { isAgentId } from "../shared/ids.js";
import type { Config } from "../shared/config/config-types.js";
import { invalidArgument, permissionDenied } from "../shared/errors.js";
import {
  catchStopCommand,
  stampDecider,
  validateFrame,
  validateModelName,
  validateSessionRef,
} from "../shared/frames.js";
import { AdminService } from "../shared/gen/troupe/v1/admin_pb.js";
import { GatewayService, type SubscribeInboxResponse } from "../shared/gen/troupe/v1/gateway_pb.js";
import { Health } from "../shared/gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../shared/gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as AlphaReflection } from "../shared/gen/grpc/reflection/v1alpha/reflection_pb.js";
import { reflectionServices } from "./reflection.js";
import { adminService } from "./admin.js";
import { GatewayLimits } from "./limits.js";
import { TenantQuotas } from "../shared/auth/quotas.js";
import { nextPageToken, pageOf } from "../shared/paging.js";
import { RouterService, type ResolveSessionResponse } from "../shared/gen/troupe/v1/router_pb.js";
import type { RunnerService } from "../shared/gen/troupe/v1/runner_pb.js";
import { ClientFrameSchema, type ClientFrame } from "../shared/gen/troupe/v1/session_pb.js";
import type { Logger } from "../shared/process/log.js";
import { RECONNECT_WAIT_MS, RpcServer, createClient, type grpc, type ServiceClient } from "../shared/rpc.js";
import type { CallContext } from "../shared/rpc/call-context.js";
import { BYTES_MARK, byteLength, Channel } from "../shared/rpc/channel.js";
import type { RunningService } from "../shared/process/service.js";
import { extractContext } from "../shared/process/telemetry.js";
import { PlacementCache, RunnerPool } from "./placement.js";
import { asSubscribeResponse, relayRunner, type RunnerRelay } from "./passthrough.js";
import { TurnSpans } from "./turn-spans.js";
import { chatHandler } from "./chat.js";
import { listOwnedSessions } from "./session-listing.js";
import { InboxHints, InboxStream } from "./inbox.js";
import { deliverHandler } from "./deliver.js";
import { DEFAULT_NET_POLICY } from "../shared/net/net-guard.js";
import { watchedKeys } from "./revocation.js";
import { A2AService } from "../shared/gen/lf/a2a/v1/a2a_pb.js";
import { a2aCore } from "./a2a/a2a-core.js";
import { a2aGrpc, keepingCallerKey } from "./a2a/grpc-binding.js";
import { type Loopback, openLoopback } from "./loopback.js";

type RunnerClient = ServiceClient<(typeof RunnerService)["method"]>;

export async function startGateway(cfg: Config, logger: Logger): Promise<RunningService> {
  const internal = await internalCredentials(cfg.dataDir, cfg.internalToken, cfg.internalCa);
  const { keys, streams } = await watchedKeys(cfg, logger);
  const limits = new GatewayLimits(cfg.limits);
  const quotas = await new TenantQuotas(cfg.quotaDefaults, cfg.quotasFile).start((err) =>
    logger.error("quotas file rejected; keeping the quotas read before", {
      error: String((err as Error).message ?? err),
    }),
  );
  /** Prompts, steering and follow-ups draw from the tenant's and the session's budgets; aborts from the tenant's abort quota. */
  const admit = (tenant: string, sessionId: string, frame: ClientFrame) => {
    const kind = frame.kind.case;
    if (kind === "prompt" || kind === "steer" || kind === "followUp") limits.admitMessage(tenant, sessionId);
    else if (kind === "abort") limits.admitAbort(tenant, quotas.of(tenant).abortsPerSecond);
  };
  const router = createClient(RouterService, cfg.addr.router, { headers: internal.headers, tls: internal.tls });
  const placements = new PlacementCache(router);
  const runners = new RunnerPool(cfg.maxMessageBytes, internal.headers, internal.tls);
  const inboxHints = new InboxHints();

  /** Calls the caller's session's runner; if it is gone or the session moved, retries once where it is now. */
  const withRunner = async <T>(
    call: { metadata: grpc.Metadata },
    sessionId: string,
    fn: (runner: RunnerClient, placement: ResolveSessionResponse) => Promise<T>,
  ): Promise<T> => {
    validateSessionRef(sessionId, "", false);
    const who = identityOf(call.metadata);
    // A runner that moved or restarted: placed again and retried. A restarted runner's channel may
    // be in its reconnect backoff (at most 2.4 s, limits.ts), where a call fails at once: a retry
    // waits for the channel first, so a caller does not see UNAVAILABLE from a runner that is back.
    for (let attempt = 0; ; attempt++) {
      const placement = await placements.resolve(who, sessionId, "");
      const runner = runners.get(placement.runner!.address);
      if (attempt > 0) await runner.ready(RECONNECT_WAIT_MS);
      try {
        return await fn(runner, placement);
      } catch (err) {
        if (attempt >= 2 || !placements.reroute(who, sessionId, err)) throw err;
      }
    }
  };

  /**
   * Submits a client's frame to its session. `owner`: the session is another principal's of the
   * caller's tenant (an approver's decision); the caller's right to that was checked.
   */
  const submit = async (
    sessionId: string,
    sent: ClientFrame,
    call: grpc.ServerUnaryCall<unknown, unknown>,
    owner?: string,
    decider = identityOf(call.metadata).principal,
  ) => {
    const metadata = owner
      ? identityMetadata({ tenant: identityOf(call.metadata).tenant, principal: owner })
      : call.metadata;
    const caller = owner ? metadata : onBehalfOf(call);
    validateFrame(sent, true, true);
    const frame = stampDecider(catchStopCommand(sent), decider);
    admit(identityOf(metadata).tenant, sessionId, frame);
    const spans = new TurnSpans(
      extractContext(metadata),
      () => sessionId,
      () => "",
    );
    const traced = spans.start(frame);
    try {
      const res = await withRunner({ metadata }, sessionId, (runner) =>
        runner.submit({ sessionId, frame: traced }, { metadata: caller, parent: call }),
      );
      return { accepted: res.accepted };
    } finally {
      spans.endAll();
    }
  };

  // An A2A call keeps its key, for the calls the binding makes for it (a2a/grpc-binding.ts).
  const authenticate = keepingCallerKey(apiKeyAuth(keys));
  const server = new RpcServer({ maxMessageBytes: cfg.maxMessageBytes, authenticate, logger });
  /**
   * A client's stream takes one of its tenant's open streams, and fails with the reason when its
   * key is revoked; both are let go when the call ends, and `leave` is called then.
   */
  const holdClientStream = (ctx: CallContext, out: { fail(err: unknown): void }, leave: () => void) => {
    const release = limits.openStream(identityOf(ctx.metadata).tenant);
    const unwatch = streams.add(callerOf(ctx.metadata).keyHash, (err) => out.fail(err));
    ctx.signal.addEventListener(
      "abort",
      () => {
        release();
        unwatch();
        leave();
      },
      { once: true },
    );
  };
  // Snapshots are the sandbox service's, asked as the caller (workspace-snapshots.ts).
  const sandbox = createClient(SandboxService, cfg.addr.sandbox, { headers: internal.headers, tls: internal.tls });
  server.add(GatewayService, {
    chat: chatHandler({ placements, runners, limits, streams, admit }),
    ...workspaceSnapshotCalls(sandbox),

    async createSession(req, call) {
      validateSessionRef(req.sessionId, req.agentId, true);
      validateModelName(req.model);
      const first = await placements.resolve(identityOf(call.metadata), req.sessionId, req.agentId);
      const res = await withRunner(call, first.sessionId, (runner, placement) =>
        runner.ensureSession(
          {
            open: {
              sessionId: placement.sessionId,
              agentId: first.agentId,
              create: true,
              queueMode: req.queueMode,
              model: req.model,
              history: req.history,
            },
          },
          { metadata: onBehalfOf(call), parent: call },
        ),
      );
      return { session: res.session };
    },

    sendMessage: (req, call) =>
      submit(
        req.sessionId,
        create(ClientFrameSchema, {
          frameId: req.frameId,
          kind: {
            case: "prompt",
            value: {
              text: req.text,
              queueMode: req.queueMode,
              clientTools: req.clientTools,
              instruction: req.instruction,
              images: req.images,
              sampling: req.sampling,
            },
          },
        }),
        call,
      ),
    steer: (req, call) =>
      submit(
        req.sessionId,
        create(ClientFrameSchema, { frameId: req.frameId, kind: { case: "steer", value: { text: req.text } } }),
        call,
      ),
    followUp: (req, call) =>
      submit(
        req.sessionId,
        create(ClientFrameSchema, { frameId: req.frameId, kind: { case: "followUp", value: { text: req.text } } }),
        call,
      ),
    abort: (req, call) =>
      submit(
        req.sessionId,
        create(ClientFrameSchema, {
          frameId: req.frameId,
          kind: { case: "abort", value: { reason: req.reason, clearQueue: req.clearQueue } },
        }),
        call,
      ),

    decideToolCall: async (req, call) => {
      const me = callerOf(call.metadata);
      const owner = req.principal === "" || req.principal === me.principal ? undefined : req.principal;
      // Someone else's session: only the tenant's approvers decide there, and nobody learns whether it exists.
      if (owner !== undefined && me.role !== "approver")
        throw permissionDenied(
          `only the session's own principal or a key with the approver role may decide on its tool calls (this key's role is ${me.role})`,
        );
      if (owner !== undefined && !NAME.test(owner)) throw invalidArgument("principal is not a valid principal name");
      // An adapter decides for a person of a channel it speaks for; the decision names that person.
      let decider = me.principal;
      if (req.channelSender !== "") {
        const channel = /^([a-z0-9_-]{1,64}):[\x21-\x7e]{1,128}$/.exec(req.channelSender)?.[1];
        if (me.role !== "adapter" || channel === undefined || !me.channels.includes(channel))
          throw permissionDenied("channel_sender is for adapter keys, naming a sender of a channel the key speaks for");
        decider = req.channelSender;
      }
      return submit(
        req.sessionId,
        create(ClientFrameSchema, {
          frameId: req.frameId,
          kind: {
            case: "toolDecision",
            value: {
              toolCallId: req.toolCallId,
              verdict: req.verdict,
              message: req.message,
              argumentsJson: req.argumentsJson,
            },
          },
        }),
        call,
        owner,
        decider,
      );
    },

    submitToolResult: (req, call) =>
      submit(
        req.sessionId,
        create(ClientFrameSchema, {
          frameId: req.frameId,
          kind: {
            case: "clientToolResult",
            value: { toolCallId: req.toolCallId, output: req.output, isError: req.isError },
          },
        }),
        call,
      ),

    // Served over the runner's Attach stream (open with replay_after_seq, no create) rather than
    // Replay, so that a client leaving ends the runner's stream without a reset.
    subscribe({ sessionId, afterSeq }, ctx) {
      validateSessionRef(sessionId, "", false);
      const caller = onBehalfOf(ctx);
      const who = identityOf(ctx.metadata);
      const out = new Channel<Buffer>(BYTES_MARK, byteLength);
      let runner: RunnerRelay | undefined;
      holdClientStream(ctx, out, () => runner?.leave());
      const attempt = async (n: number): Promise<void> => {
        const placement = await placements.resolve(who, sessionId, "");
        if (out.closed) return;
        const up = runners.attach(placement.runner!.address, caller);
        runner = relayRunner(up, out, asSubscribeResponse, (err) => {
          if (n > 0 || !placements.reroute(who, sessionId, err)) return false;
          attempt(1).catch((e) => out.fail(e));
          return true;
        });
        up.write({
          frame: {
            frameId: "subscribe",
            kind: { case: "open", value: { sessionId, create: false, replayAfterSeq: afterSeq } },
          },
        });
      };
      attempt(0).catch((e) => out.fail(e));
      return out;
    },

    subscribeInbox(req, ctx) {
      const who = identityOf(ctx.metadata);
      const out = new Channel<SubscribeInboxResponse>();
      const inbox = new InboxStream(
        {
          placements,
          runners,
          list: (caller) => listOwnedSessions(router, runners, caller),
          hints: inboxHints,
          logger,
        },
        who,
        onBehalfOf(ctx),
        (res) => out.push(res),
        (fn) => {
          const room = out.room();
          if (room) void room.then(fn);
          else fn();
        },
      );
      holdClientStream(ctx, out, () => inbox.close());
      inbox.start(req.afterCursor).catch((err) => out.fail(err));
      return out;
    },

    async createSchedule(req, call) {
      if (!req.schedule) throw invalidArgument("schedule is required");
      const schedule = req.schedule;
      const res = await withRunner(call, schedule.sessionId, (runner) =>
        runner.putSchedule({ schedule }, { metadata: onBehalfOf(call), parent: call }),
      );
      return { schedule: res.schedule };
    },

    async listSchedules(req, call) {
      const res = await withRunner(call, req.sessionId, (runner) =>
        runner.readSchedules({ sessionId: req.sessionId }, { metadata: onBehalfOf(call), parent: call }),
      );
      return { schedules: res.schedules };
    },

    async deleteSchedule(req, call) {
      const res = await withRunner(call, req.sessionId, (runner) =>
        runner.removeSchedule(
          { sessionId: req.sessionId, scheduleId: req.scheduleId },
          { metadata: onBehalfOf(call), parent: call },
        ),
      );
      return { deleted: res.deleted };
    },

    async getHistory(req, call) {
      const page = await withRunner(call, req.sessionId, (runner) =>
        runner.readHistory(
          { sessionId: req.sessionId, pageSize: req.pageSize, pageToken: req.pageToken },
          { metadata: onBehalfOf(call), parent: call },
        ),
      );
      return { messages: page.messages, nextPageToken: page.nextPageToken };
    },

    async deleteSession(req, call) {
      const res = await withRunner(call, req.sessionId, (runner) =>
        runner.deleteStoredSession(
          { sessionId: req.sessionId, forgetMemories: req.forgetMemories },
          { metadata: onBehalfOf(call), parent: call },
        ),
      );
      placements.invalidate(identityOf(call.metadata), req.sessionId);
      return { memoriesForgotten: res.memoriesForgotten, sandboxRemoved: res.sandboxRemoved };
    },

    deliver: deliverHandler({
      router,
      admit,
      withRunner,
      onBehalfOf,
      channelReset: cfg.channelReset,
      netPolicy: { ...DEFAULT_NET_POLICY, ...cfg.net, proxy: cfg.outboundProxy },
      hints: inboxHints,
      logger,
    }),

    async listMcpServers(req, call) {
      if (!isAgentId(req.agentId) && req.sessionId === "") throw invalidArgument("agent_id must name an agent");
      // Without a session, the servers are connected for the asking, in a sandbox session made
      // for it (and removed after); it is placed like any session of the caller's.
      const probeId = req.sessionId === "" ? `mcp-probe-${randomUUID()}` : "";
      const res = await withRunner(call, req.sessionId || probeId, (runner) =>
        runner.describeMcpServers(
          { agentId: req.agentId, sessionId: req.sessionId, probeId },
          { metadata: onBehalfOf(call), timeoutMs: 90_000, parent: call },
        ),
      );
      return { servers: res.servers };
    },

    async listSessions(req, call) {
      const caller = onBehalfOf(call);
      const page = pageOf(req.pageSize, req.pageToken);
      const all = await listOwnedSessions(router, runners, caller);
      const sorted = [...all.values()].sort((a, b) => a.sessionId.localeCompare(b.sessionId));
      return {
        sessions: sorted.slice(page.offset, page.offset + page.size),
        nextPageToken: nextPageToken(page, sorted.length),
      };
    },
  });

  server.add(AdminService, adminService(router, runners));
  // Reflection (grpcurl list, describe) is open to all, like health: the schema is public, not what it reaches.
  const reflection = reflectionServices([GatewayService, AdminService, A2AService, Health]);
  server.add(ServerReflection, reflection.v1);
  server.add(AlphaReflection, reflection.v1alpha);

  // A2A's gRPC binding, beside Troupe's services; it and the HTTP edge call the gateway back.
  let loopback: Loopback | undefined;
  const a2a = a2aCore(() => loopback!.gateway, {
    agentsDir: cfg.agentsDir,
    net: { ...DEFAULT_NET_POLICY, ...cfg.net, proxy: cfg.outboundProxy },
  });
  server.add(
    A2AService,
    a2aGrpc(() => a2a),
  );

  const port = await server.listen(cfg.addr.gateway, cfg.tls);
  logger.info(`gateway serving on port ${port}${cfg.tls ? " (TLS)" : ""}`, { maxMessageBytes: cfg.maxMessageBytes });
  loopback = await openLoopback(server, cfg.maxMessageBytes);
  // The HTTP address's modules (Connect, the console) load only when it is on: 8 MB resident.
  const http = cfg.httpAddr
    ? await (await import("./http/serve.js")).serveHttp(
        cfg,
        server,
        loopback,
        { core: a2a, grpcPort: port },
        authenticate,
        logger,
      )
    : undefined;
  return {
    async drain() {
      await Promise.all([http?.close(cfg.drainGraceMs), server.drain(cfg.drainGraceMs)]);
      keys.stop();
      limits.stop();
      quotas.stop();
      // Client streams first, with a status they retry on; then the runner calls they were using.
      await server.close();
      runners.close();
      router.close();
      sandbox.close();
      loopback?.close();
    },
  };
}
