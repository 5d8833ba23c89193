// Deliver: a message from a chat channel, through an adapter key, becomes a prompt in the session
// the router names for it (made on its first message). A directive from a sender with command
// rights is carried out instead (directives.ts); the message's media become images for vision
// models and files for the workspace (media.ts); the owner's inboxes hear of the session at once.
import { create } from "@bufbuild/protobuf";
import { callerOf, identityMetadata, identityOf } from "../shared/auth/auth.js";
import type { Config } from "../shared/config/config-types.js";
import { Status, grpcCode, permissionDenied } from "../shared/errors.js";
import { catchStopCommand } from "../shared/frames.js";
import type { DeliverRequest } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { RouterService } from "../shared/gen/troupe/v1/router_pb.js";
import type { RunnerService } from "../shared/gen/troupe/v1/runner_pb.js";
import { ClientFrameSchema, QueueMode, type ClientFrame } from "../shared/gen/troupe/v1/session_pb.js";
import type { Logger } from "../shared/process/log.js";
import type { NetPolicy } from "../shared/net/net-guard.js";
import type { grpc, ServiceClient } from "../shared/rpc.js";
import { carryOut, parseDirective } from "./directives.js";
import { labelName, memoryOwnerOf, normaliseInbound } from "./inbound.js";
import type { InboxHints } from "./inbox.js";
import { attachmentsOf, imagesOf } from "./media.js";

type RunnerClient = ServiceClient<(typeof RunnerService)["method"]>;
type Call = { metadata: grpc.Metadata };

export interface DeliverDeps {
  router: ServiceClient<(typeof RouterService)["method"]>;
  /** Draws a frame from the tenant's and the session's budgets; throws RESOURCE_EXHAUSTED. */
  admit(tenant: string, sessionId: string, frame: ClientFrame): void;
  /** Calls the session's runner, placed again and retried where it moved. */
  withRunner<T>(call: Call, sessionId: string, fn: (runner: RunnerClient) => Promise<T>): Promise<T>;
  /** The caller's identity as the runner takes it. */
  onBehalfOf(call: Call): grpc.Metadata;
  channelReset: Config["channelReset"];
  /** Media URLs are fetched through the SSRF guard, as agents' web requests are. */
  netPolicy: NetPolicy;
  hints: InboxHints;
  logger: Logger;
}

export function deliverHandler(deps: DeliverDeps) {
  const { router, admit, withRunner, onBehalfOf, hints, logger, netPolicy } = deps;
  return async (req: DeliverRequest, call: Call) => {
    // Only an adapter key speaks for channel senders, and only for its own channels.
    const key = callerOf(call.metadata);
    if (key.role !== "adapter")
      throw permissionDenied(
        `Deliver needs an adapter key (troupe keys create --role adapter --channel NAME); this key's role is ${key.role}`,
      );
    const inbound = normaliseInbound(req.message);
    if (!key.channels.includes(inbound.context.channel))
      throw permissionDenied(
        `this adapter key speaks for ${key.channels.join(", ")}, not for channel ${inbound.context.channel}`,
      );
    const route = await router.resolveInbound({ context: inbound.context }, { metadata: identityMetadata(key) });
    const sessionId = route.sessionKey;
    // In a session several senders write to in private, a message never joins another's run
    // (steered in, or collected with it): its own run answers it, in its own chat.
    const queueMode = route.sharedDm ? QueueMode.FOLLOWUP : req.queueMode;
    // The frame says who sent it: in a group (or a main session many write to) each run then
    // recalls and learns for its own speaker, and the history labels who said what.
    const prompt = create(ClientFrameSchema, {
      frameId: inbound.frameId,
      speaker: {
        id: memoryOwnerOf(route.canonicalSender),
        displayName: labelName(inbound.context.sender?.displayName ?? ""),
      },
      kind: { case: "prompt", value: { text: inbound.body, queueMode } },
    });
    const caller = onBehalfOf(call);
    // Commands from the channel act only when the adapter says the sender may use them.
    const directive = inbound.commandAuthorized ? parseDirective(inbound.body) : undefined;
    if (directive) {
      admit(identityOf(call.metadata).tenant, sessionId, prompt);
      const directiveReply = await withRunner(call, sessionId, (runner) =>
        carryOut(directive, runner, caller, deps.channelReset, {
          open: { sessionId, agentId: route.agentId, create: true, queueMode },
          memoryOwner: memoryOwnerOf(route.canonicalSender),
        }),
      );
      return { sessionId, agentId: route.agentId, matchedTier: route.matchedTier, directiveReply };
    }
    if (prompt.kind.case === "prompt" && inbound.media.length > 0) {
      const [images, files] = await Promise.all([
        imagesOf(inbound.media, netPolicy, logger),
        attachmentsOf(inbound.media, inbound.frameId, netPolicy, logger),
      ]);
      prompt.kind.value.images = images;
      prompt.kind.value.attachments = files.attachments;
      if (files.lines.length > 0) prompt.kind.value.text = [inbound.body, ...files.lines].join("\n");
    }
    const frame = inbound.commandAuthorized ? catchStopCommand(prompt) : prompt;
    admit(identityOf(call.metadata).tenant, sessionId, frame);
    const accepted = await withRunner(call, sessionId, async (runner) => {
      try {
        return (await runner.submit({ sessionId, frame }, { metadata: caller })).accepted;
      } catch (err) {
        if (grpcCode(err) !== Status.NOT_FOUND) throw err;
        // The first message of this session key: make the session, for the routed agent.
        // Its runs recall the sender's memories (one person across channels, after identity links).
        await runner.ensureSession(
          {
            open: { sessionId, agentId: route.agentId, create: true, queueMode },
            memoryOwner: memoryOwnerOf(route.canonicalSender),
          },
          { metadata: caller },
        );
        return (await runner.submit({ sessionId, frame }, { metadata: caller })).accepted;
      }
    });
    hints.touched(identityOf(call.metadata), sessionId);
    return { sessionId, agentId: route.agentId, matchedTier: route.matchedTier, accepted };
  };
}
