// The router: which agent and session a message is for, and which runner owns that session.
// Sessions are placed by rendezvous (highest-random-weight) hashing over the live runners, so a
// runner joining or leaving moves only its own share. Who is live: membership.ts, by store kind.
// Either way the session's lease in
// the store, not this placement, decides who runs it: a runner asked for a session live elsewhere
// answers ABORTED with the owner's address.
import { createHash } from "node:crypto";
import { identityOf, internalCredentials, internalServing } from "../shared/auth/auth.js";
import type { Config } from "../shared/config/config-types.js";
import { invalidArgument, invalidArgumentIf, unavailable } from "../shared/errors.js";
import { ChatType, type ChannelContext } from "../shared/gen/troupe/v1/inbound_pb.js";
import { ReloadingFile } from "../shared/config/reloading-file.js";
import { EMPTY_ROUTING, InboundRouter, parseRouting } from "./bindings.js";
import { validateSessionRef } from "../shared/frames.js";
import { RouterService, type RunnerInfo } from "../shared/gen/troupe/v1/router_pb.js";
import { CHANNEL_NAME, DEFAULT_AGENT, newId } from "../shared/ids.js";
import type { Logger } from "../shared/process/log.js";
import { RpcServer, type grpc } from "../shared/rpc.js";
import { refKey, refOf } from "../shared/session-ref.js";
import type { RunningService } from "../shared/process/service.js";
import { storeKind } from "../shared/store-kind.js";
import { LEASE_TTL_MS, MEMBERSHIPS, RunnerDirectory } from "./membership.js";

/** The runner with the highest hash weight for this key. */
export function placeOn(runners: readonly RunnerInfo[], key: string): RunnerInfo | undefined {
  let best: RunnerInfo | undefined;
  let bestWeight = -1n;
  for (const runner of runners) {
    const weight = createHash("sha256").update(`${runner.runnerId}\0${key}`).digest().readBigUInt64BE(0);
    if (weight > bestWeight) {
      best = runner;
      bestWeight = weight;
    }
  }
  return best;
}

export const sessionKey = (agentId: string, sessionId: string) => `agent:${agentId}:${sessionId}`;

/** What the router checks of a channel context (the gateway has normalised it already). */
function checkContext(ctx: ChannelContext | undefined): ChannelContext {
  if (!ctx) throw invalidArgument("context is required");
  invalidArgumentIf(!CHANNEL_NAME.test(ctx.channel), "context.channel must be 1-32 of a-z 0-9 _ -");
  invalidArgumentIf(ctx.chatType === ChatType.UNSPECIFIED, "context.chat_type is required");
  invalidArgumentIf(!ctx.sender?.id, "context.sender.id is required");
  invalidArgumentIf(
    ctx.chatType !== ChatType.DIRECT && !ctx.peer?.id,
    "context.peer.id is required for group and channel chats",
  );
  return ctx;
}

export async function startRouter(cfg: Config, logger: Logger): Promise<RunningService> {
  const listenTls = internalServing(cfg, "router service");
  const directory = new RunnerDirectory();
  const members = MEMBERSHIPS[storeKind(cfg.storeUrl)](cfg.storeUrl, cfg.runnerLivenessMs, directory);
  const { membership } = members;
  // Routing rules, read again when the file changes (which also empties the resolution cache).
  let routes = new InboundRouter(EMPTY_ROUTING);
  const routing = new ReloadingFile(cfg.routingFile, parseRouting, EMPTY_ROUTING, (config) => {
    routes = new InboundRouter(config);
    logger.info(
      `routing: ${config.bindings.length} bindings, dm_scope ${config.dmScope}, default agent ${config.defaultAgent}`,
      { file: cfg.routingFile },
    );
  });
  await routing.reload();
  routing.watch(2000, (err) =>
    logger.error("routing file rejected; keeping the rules read before", {
      error: String((err as Error).message ?? err),
    }),
  );
  /**
   * Placement hashes the session's ref (its owner's tenant and principal, from the call's
   * metadata, and its id): the session's log, not its agent, decides where it lives, and two
   * owners' sessions of one id are two sessions, spread like any others.
   */
  const place = async (sessionId: string, call: { metadata: grpc.Metadata }) => {
    const runner = placeOn(await membership.live(), refKey(refOf(identityOf(call.metadata), sessionId)));
    if (!runner) throw unavailable(members.noneLive);
    return runner;
  };
  const server = new RpcServer({
    maxMessageBytes: cfg.maxMessageBytes,
    authenticate: (await internalCredentials(cfg.dataDir, cfg.internalToken)).authenticate,
    logger,
  });
  server.add(RouterService, {
    async resolveSession(req, call) {
      validateSessionRef(req.sessionId, req.agentId, true);
      const sessionId = req.sessionId || newId();
      const agentId = req.agentId || DEFAULT_AGENT;
      return { sessionId, agentId, sessionKey: sessionKey(agentId, sessionId), runner: await place(sessionId, call) };
    },
    async registerRunner(req) {
      invalidArgumentIf(
        !req.runner?.runnerId || !req.runner.address,
        "runner.runner_id and runner.address are required",
      );
      const known = directory.liveNow().some((r) => r.runnerId === req.runner!.runnerId);
      directory.renew(req.runner!, req.draining);
      if (!known && !req.draining) logger.info(`runner ${req.runner!.runnerId} registered at ${req.runner!.address}`);
      if (req.draining) logger.info(`runner ${req.runner!.runnerId} is draining`);
      return { leaseTtlMs: LEASE_TTL_MS };
    },
    async listRunners() {
      return { runners: await membership.live() };
    },
    async resolveInbound(req, call) {
      const route = routes.resolve(checkContext(req.context));
      return {
        agentId: route.agentId,
        matchedTier: route.tier,
        sessionKey: route.sessionKey,
        canonicalSender: route.canonicalSender,
        sharedDm: route.sharedDm,
        runner: await place(route.sessionKey, call),
      };
    },
  });
  const port = await server.listen(cfg.addr.router, listenTls);
  logger.info(`router serving on port ${port}`);
  return {
    async drain() {
      routing.stop();
      await server.drain(cfg.drainGraceMs);
      await members.close();
      await server.close();
    },
  };
}
