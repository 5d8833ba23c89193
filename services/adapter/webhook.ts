// `troupe adapter webhook`: a channel for anything that can POST JSON. Inbound, a signed POST to
// /messages (the body: services/shared/schemas/webhook-message.schema.json) is delivered to the
// gateway; the answer says which session took it, or carries a directive's reply. Outbound, each
// complete reply is POSTed to the reply URL, signed the same way, with X-Troupe-Delivery naming
// it: a receiver keeps the ones it has seen, because a reply whose success was not heard (a
// timeout, an adapter killed at that moment) is sent again. 5xx, 408, 429 and network failures are
// retried with backoff (honouring Retry-After) for up to REPLY_GIVE_UP_MS; other 4xx are final.
import type http from "node:http";
import { discardBody } from "../shared/net/bounded-body.js";
import { ChatType } from "../shared/gen/troupe/v1/inbound_pb.js";
import { RETRY_AFTER_TRAILER, Status, toStatus } from "../shared/errors.js";
import { schemaProblems } from "../shared/json-schema.js";
import type { Logger } from "../shared/process/log.js";
import type { grpc } from "../shared/rpc.js";
import { deliverFrom, type GatewayClient } from "./deliver.js";
import { TROUPE_SIGNATURE, signatureProblem, signedHeaders } from "./signature.js";
import { serveInbound, type InboundAnswer } from "./http-inbound.js";
import type { ReplySink } from "./replies.js";
import type { AdapterState, Address, Post } from "./state.js";
import type { ChannelAdapter } from "./channel-adapter.js";

const REPLY_GIVE_UP_MS = 10 * 60_000;
const REPLY_TIMEOUT_MS = 15_000;

export interface WebhookOptions {
  listen: string;
  secret: string;
  replyUrl: string;
  channel: string;
  accountId: string;
  logger: Logger;
}

interface WebhookMessage {
  id: string;
  chat: { id: string; type?: "direct" | "group" | "channel"; name?: string };
  sender: { id: string; name?: string };
  thread_id?: string;
  text?: string;
  media?: {
    url: string;
    mime_type?: string;
    file_name?: string;
    size_bytes?: number;
    caption?: string;
    transcript?: string;
  }[];
  command_authorized?: boolean;
}

const CHAT_TYPES = { direct: ChatType.DIRECT, group: ChatType.GROUP, channel: ChatType.CHANNEL } as const;

/** The HTTP status a gateway refusal becomes, as Connect maps gRPC codes. */
const HTTP_OF: Partial<Record<Status, number>> = {
  [Status.INVALID_ARGUMENT]: 400,
  [Status.UNAUTHENTICATED]: 502,
  [Status.PERMISSION_DENIED]: 502,
  [Status.NOT_FOUND]: 404,
  [Status.RESOURCE_EXHAUSTED]: 429,
  [Status.UNAVAILABLE]: 503,
  [Status.DEADLINE_EXCEEDED]: 504,
};

export async function startWebhookAdapter(
  gateway: GatewayClient,
  state: AdapterState,
  opts: WebhookOptions,
): Promise<{ port: number; close(): Promise<void> }> {
  const handle = async (raw: Buffer, req: http.IncomingMessage): Promise<InboundAnswer> => {
    if (!/^application\/json\b/i.test(req.headers["content-type"] ?? ""))
      return { status: 415, body: { error: "content-type must be application/json" } };
    const bad = signatureProblem(TROUPE_SIGNATURE, opts.secret, req.headers, raw);
    if (bad) return { status: 401, body: { error: bad } };
    let doc: unknown;
    try {
      doc = JSON.parse(raw.toString("utf8"));
    } catch {
      return { status: 400, body: { error: "the body is not JSON" } };
    }
    const problems = schemaProblems("webhook-message", doc);
    if (problems.length > 0) return { status: 400, body: { error: problems.join("; ") } };
    const m = doc as WebhookMessage;
    const from: Address = { chat_id: m.chat.id, message_id: m.id, ...(m.thread_id ? { thread_id: m.thread_id } : {}) };
    try {
      const res = await deliverFrom(
        gateway,
        state,
        {
          idempotencyKey: m.id,
          context: {
            channel: opts.channel,
            accountId: opts.accountId,
            sender: { id: m.sender.id, displayName: m.sender.name ?? "" },
            chatType: CHAT_TYPES[m.chat.type ?? "direct"],
            peer: { id: m.chat.id, displayName: m.chat.name ?? "" },
            threadId: m.thread_id ?? "",
          },
          text: m.text ?? "",
          media: (m.media ?? []).map((x) => ({
            url: x.url,
            mimeType: x.mime_type ?? "",
            fileName: x.file_name ?? "",
            sizeBytes: BigInt(x.size_bytes ?? 0),
            caption: x.caption ?? "",
            transcript: x.transcript ?? "",
          })),
          commandAuthorized: m.command_authorized === true,
        },
        from,
      );
      const duplicate = res.accepted?.payload.case === "frameAccepted" && res.accepted.payload.value.duplicate;
      return {
        status: 200,
        body: {
          session_id: res.sessionId,
          agent_id: res.agentId,
          duplicate,
          ...(res.directiveReply ? { reply: res.directiveReply } : {}),
        },
      };
    } catch (err) {
      const status = toStatus(err);
      const code = HTTP_OF[status.code] ?? 500;
      const retry = (err as { metadata?: grpc.Metadata }).metadata?.get(RETRY_AFTER_TRAILER)[0];
      const headers: Record<string, string> = retry ? { "retry-after": String(Math.ceil(Number(retry) / 1000)) } : {};
      if (code >= 500) opts.logger.warn("the gateway did not take a webhook message", { error: status.details });
      return { status: code, body: { error: status.details }, headers };
    }
  };

  return serveInbound(opts.listen, "/messages", handle, opts.logger);
}

/** Complete replies as signed POSTs to the reply URL. */
export function webhookReplies(opts: WebhookOptions): ReplySink {
  return {
    async final(to: Address, delivery: string, _post: Post, text: string) {
      const body = JSON.stringify({
        id: delivery,
        chat_id: to.chat_id,
        ...(to.thread_id ? { thread_id: to.thread_id } : {}),
        in_reply_to: to.message_id,
        text,
      });
      const deadline = Date.now() + REPLY_GIVE_UP_MS;
      for (let attempt = 1, pauseMs = 500; ; attempt++, pauseMs = Math.min(pauseMs * 2, 30_000)) {
        let waitMs = pauseMs;
        try {
          const res = await fetch(opts.replyUrl, {
            method: "POST",
            headers: {
              "content-type": "application/json",
              "x-troupe-delivery": delivery,
              ...signedHeaders(opts.secret, body),
            },
            body,
            signal: AbortSignal.timeout(REPLY_TIMEOUT_MS),
          });
          await discardBody(res);
          if (res.ok) return;
          if (res.status !== 408 && res.status !== 429 && res.status < 500) {
            opts.logger.error("the reply URL refused a reply; it is dropped", { status: res.status, delivery });
            return;
          }
          const after = Number(res.headers.get("retry-after"));
          if (Number.isFinite(after) && after > 0) waitMs = after * 1000;
        } catch (err) {
          opts.logger.warn("could not reach the reply URL; trying again", { error: String(err), attempt });
        }
        if (Date.now() + waitMs > deadline) {
          opts.logger.error("gave up on a reply after retrying for 10 minutes", { delivery });
          return;
        }
        await new Promise((r) => setTimeout(r, waitMs));
      }
    },
  };
}

/** The webhook adapter: its caller signs every request and vouches for its users, so DMs are open by default. */
export const webhookAdapter: ChannelAdapter = {
  defaultDmPolicy: "open",
  missing: (a) =>
    !a.webhookSecret
      ? "set TROUPE_WEBHOOK_SECRET: the key both sides sign with"
      : !a.webhookReplyUrl
        ? "set TROUPE_WEBHOOK_REPLY_URL (or --reply-url): where replies go"
        : undefined,
  async start({ gateway, state, settings: a, channel, account, logger }) {
    const opts = {
      listen: a.webhookAddr,
      secret: a.webhookSecret,
      replyUrl: a.webhookReplyUrl,
      channel,
      accountId: account,
      logger,
    };
    const server = await startWebhookAdapter(gateway, state, opts);
    return {
      inbound: server,
      replies: webhookReplies(opts),
      serving: `webhook adapter taking POST /messages on port ${server.port}; replies to ${a.webhookReplyUrl}`,
    };
  },
};
