// The inbound half of every adapter: a platform message becomes a Deliver call. The chat it came
// from is recorded under the message's frame id first, so the run it starts can be answered
// there even when the run's first event arrives before Deliver returns. A gateway that is away
// or asks to slow down is waited for; any other refusal is the caller's to report.
import type { MessageInitShape } from "@bufbuild/protobuf";
import { RETRY_AFTER_TRAILER, Status, grpcCode } from "../shared/errors.js";
import { inboundFrameId } from "../shared/frames.js";
import type { DeliverResponse } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { InboundMessageSchema } from "../shared/gen/troupe/v1/inbound_pb.js";
import type { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { grpc, ServiceClient } from "../shared/rpc.js";
import type { AdapterState, Address } from "./state.js";

/** The gateway, as an adapter's key reaches it (the CLI makes the client: cli/adapter.ts). */
export type GatewayClient = ServiceClient<(typeof GatewayService)["method"]>;
export type Inbound = MessageInitShape<typeof InboundMessageSchema>;

/** How long a Deliver keeps trying through UNAVAILABLE and RESOURCE_EXHAUSTED before giving up. */
const GIVE_UP_MS = 60_000;

/**
 * A refusal no retry will change (a message with nothing in it, a key without this channel): the
 * platform's message is acknowledged and skipped rather than sent again forever.
 */
export function neverTaken(err: unknown): boolean {
  const code = grpcCode(err);
  return code === Status.INVALID_ARGUMENT || code === Status.PERMISSION_DENIED;
}

export async function deliverFrom(
  gateway: GatewayClient,
  state: AdapterState,
  message: Inbound & { idempotencyKey: string; context: { channel: string; accountId?: string } },
  from: Address,
): Promise<DeliverResponse> {
  const frameId = inboundFrameId(message.context.channel, message.context.accountId ?? "", message.idempotencyKey);
  state.frames.set(frameId, from);
  await state.save();
  const deadline = Date.now() + GIVE_UP_MS;
  for (let pauseMs = 250; ; pauseMs = Math.min(pauseMs * 2, 5000)) {
    try {
      const res = await gateway.deliver({ message });
      state.sessions.set(res.sessionId, from);
      state.saveSoon();
      return res;
    } catch (err) {
      const code = grpcCode(err);
      if ((code !== Status.UNAVAILABLE && code !== Status.RESOURCE_EXHAUSTED) || Date.now() > deadline) throw err;
      const hinted = Number((err as { metadata?: grpc.Metadata }).metadata?.get(RETRY_AFTER_TRAILER)[0]);
      await new Promise((r) => setTimeout(r, Number.isFinite(hinted) && hinted > 0 ? hinted : pauseMs));
    }
  }
}
