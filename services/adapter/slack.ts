// `troupe adapter slack`: a Slack app through the Events API (https://api.slack.com/apis/events-api).
// Events come one of two ways. Over HTTP, Slack POSTs each to /slack/events, signed with the app's
// signing secret (https://api.slack.com/authentication/verifying-requests-from-slack: HMAC-SHA256
// of "v0:<timestamp>:<body>", five minutes of skew), and the URL is proved once by echoing a
// url_verification challenge. By Socket Mode (an app-level token given), the adapter opens a
// WebSocket to Slack and needs no public URL (slack-socket.ts). The bot takes direct messages,
// mentions (app_mention), and what is said in the threads it answered in (channel messages with
// their thread_ts); each is delivered before the 200 (or the Socket Mode acknowledgement) that
// acknowledges it, so a failure is a 5xx (or no acknowledgement) and Slack sends the event again
// (its retries, and a message arriving as both `message` and `app_mention`, are one message: the
// idempotency key is channel:ts). Replies go in the thread of the message they answer,
// streamed by chat.update (drafted-replies.ts). Tool calls held for a person are asked with
// buttons; their clicks come to the same URL, form-encoded, or by Socket Mode (slack-approvals.ts).
import { DmGate, type DmSettings } from "./dm-gate.js";
import type http from "node:http";
import { ChatType } from "../shared/gen/troupe/v1/inbound_pb.js";
import { maxMediaBytes } from "../shared/media.js";
import type { Logger } from "../shared/process/log.js";
import { deliverFrom, neverTaken, type GatewayClient } from "./deliver.js";
import { DraftedReplies, sendText, type ChatApi } from "./drafted-replies.js";
import { SlackApi, SlackApiError } from "./slack-api.js";
import { SLACK_SIGNATURE, signatureProblem } from "./signature.js";
import { serveInbound, type InboundAnswer } from "./http-inbound.js";
import { type EnvelopeOutcome, SocketModeClient } from "./slack-socket.js";
import type { AdapterState, Address } from "./state.js";
import type { ChannelAdapter } from "./channel-adapter.js";
import { type BlockActions, slackApprovals } from "./slack-approvals.js";

export interface SlackOptions {
  listen: string;
  botToken: string;
  signingSecret: string;
  /** An app-level token: events by Socket Mode, no HTTP listener. */
  appToken?: string;
  /** Socket Mode: how long one connection is kept before a new one replaces it (TROUPE_SLACK_SOCKET_REFRESH_MS). */
  socketRefreshMs: number;
  apiUrl: string;
  channel: string;
  commandUsers: Set<string>;
  /** Who may write in private (dm-gate.ts). */
  dm: DmSettings;
  draftIntervalMs: number;
  logger: Logger;
}

interface SlackFile {
  id: string;
  name?: string;
  mimetype?: string;
  size?: number;
  url_private?: string;
}

interface SlackEvent {
  type: string;
  subtype?: string;
  channel: string;
  channel_type?: "im" | "channel" | "group" | "mpim";
  user?: string;
  bot_id?: string;
  text?: string;
  ts: string;
  thread_ts?: string;
  files?: SlackFile[];
}

/** Slack as a ChatApi: chat.postMessage and chat.update; the docs advise at most 4,000 characters of text. */
export function slackChat(api: SlackApi): ChatApi {
  return {
    maxChars: 4000,
    async send(to: Address, text: string) {
      const res = await api.call<{ ts: string }>("chat.postMessage", {
        channel: to.chat_id,
        text,
        ...(to.thread_id ? { thread_ts: to.thread_id } : {}),
      });
      return res.ts;
    },
    async edit(to: Address, id: string, text: string) {
      await api.call("chat.update", { channel: to.chat_id, ts: id, text });
    },
    retryAfterS: (err) => (err instanceof SlackApiError && err.status === 429 ? (err.retryAfterS ?? 1) : undefined),
    transient: (err) => !(err instanceof SlackApiError) || err.status >= 500,
  };
}

export async function startSlackAdapter(gateway: GatewayClient, state: AdapterState, opts: SlackOptions) {
  const api = new SlackApi(opts.apiUrl, opts.botToken);
  const chat = slackChat(api);
  const auth = await api.call<{ user_id: string; team_id: string; bot_id?: string }>("auth.test", {}).catch((err) => {
    throw err instanceof SlackApiError && err.error === "invalid_auth"
      ? new Error("Slack refused SLACK_BOT_TOKEN (invalid_auth)")
      : err;
  });
  const approvals = slackApprovals({
    api,
    gateway,
    state,
    channel: opts.channel,
    commandUsers: opts.commandUsers,
    logger: opts.logger,
  });
  const replies = new DraftedReplies(chat, state, opts.draftIntervalMs, opts.logger, approvals);
  /** A button's click; answered 200 (Slack does not send interactions again), its failure logged. */
  const interactive = async (payload: unknown): Promise<void> => {
    if ((payload as { type?: string })?.type !== "block_actions") return;
    await approvals
      .clicked(payload as BlockActions)
      .catch((err: unknown) => opts.logger.error("a decision from Slack could not be taken", { error: String(err) }));
  };
  const gate = await DmGate.start({
    ...opts.dm,
    tell: (to, text) => sendText(chat, to, text, [], () => undefined),
    logger: opts.logger,
  });
  // The token goes only to Slack's own file hosts (or the configured API's, for a test's server).
  const fileOrigins = [new URL(opts.apiUrl).origin];
  const mayDownload = (url: string) => {
    try {
      const u = new URL(url);
      return (u.protocol === "https:" && u.hostname.endsWith(".slack.com")) || fileOrigins.includes(u.origin);
    } catch {
      return false;
    }
  };

  const take = async (teamId: string, e: SlackEvent): Promise<void> => {
    // Direct messages, mentions anywhere, and what is said in a thread the bot answered in; not
    // the bot's own words, nor edits and joins.
    const direct = e.type === "message" && e.channel_type === "im";
    const followed =
      e.type === "message" && !direct && e.thread_ts !== undefined && state.threads.has(`${e.channel}:${e.thread_ts}`);
    if (!(direct || followed || e.type === "app_mention") || e.bot_id || !e.user || e.user === auth.user_id) return;
    if (e.subtype !== undefined && e.subtype !== "file_share") return;
    const text = (e.text ?? "").replace(new RegExp(`<@${auth.user_id}>\\s*`, "g"), "").trim();
    // In a channel the reply starts (or joins) the thread of the message; in a DM only a thread already there.
    const thread = e.thread_ts ?? (direct ? "" : e.ts);
    const from: Address = { chat_id: e.channel, message_id: e.ts, ...(thread ? { thread_id: thread } : {}) };
    // A DM is the DM policy's: nothing of a sender it refuses goes further, not even their files.
    if (direct && !(await gate.admit({ id: e.user, name: e.user }, { chat_id: e.channel }))) return;
    if (!direct) state.threads.set(`${e.channel}:${thread}`, true);
    const media = await Promise.all(
      (e.files ?? []).map(async (f) => {
        // A file small enough for the workspace (or an image for a vision model) comes with its bytes.
        const cap = maxMediaBytes(f.mimetype);
        const fetchIt = (f.size ?? 0) <= cap && mayDownload(f.url_private ?? "");
        return {
          url: `slack:file/${f.id}`,
          mimeType: f.mimetype ?? "",
          fileName: f.name ?? "",
          sizeBytes: BigInt(f.size ?? 0),
          data: fetchIt ? await api.download(f.url_private!, cap).catch(() => new Uint8Array()) : new Uint8Array(),
        };
      }),
    );
    const peer = { id: e.channel, displayName: "" };
    const res = await deliverFrom(
      gateway,
      state,
      {
        idempotencyKey: `${e.channel}:${e.ts}`,
        context: {
          channel: opts.channel,
          accountId: auth.user_id,
          teamId,
          sender: { id: e.user, displayName: "" },
          chatType: direct ? ChatType.DIRECT : ChatType.GROUP,
          peer,
          threadId: e.thread_ts ?? "",
          parentPeer: e.thread_ts ? peer : undefined,
        },
        text,
        media,
        commandAuthorized: opts.commandUsers.has(e.user),
      },
      from,
    );
    if (res.directiveReply) await sendText(chat, from, res.directiveReply, [], () => undefined);
  };

  const handle = async (raw: Buffer, req: http.IncomingMessage): Promise<InboundAnswer> => {
    const bad = signatureProblem(SLACK_SIGNATURE, opts.signingSecret, req.headers, raw);
    if (bad) return { status: 401, body: { error: bad } };
    // Interactions (the Interactivity Request URL, set to this one) come form-encoded: payload=<json>.
    if (String(req.headers["content-type"] ?? "").startsWith("application/x-www-form-urlencoded")) {
      let payload: unknown;
      try {
        payload = JSON.parse(new URLSearchParams(raw.toString("utf8")).get("payload") ?? "");
      } catch {
        return { status: 400, body: { error: "the interaction's payload is not JSON" } };
      }
      await interactive(payload);
      return { status: 200, body: {} };
    }
    let doc: { type?: string; challenge?: string; team_id?: string; event?: SlackEvent };
    try {
      doc = JSON.parse(raw.toString("utf8"));
    } catch {
      return { status: 400, body: { error: "the body is not JSON" } };
    }
    if (doc.type === "url_verification") return { status: 200, body: { challenge: doc.challenge } };
    return (await callback(doc)) === "ack"
      ? { status: 200, body: {} }
      : { status: 503, body: { error: "not delivered; retry" } };
  };

  /** An event_callback, however it came: "ack" once taken (or refused for good), "retry" to have it sent again. */
  const callback = async (doc: { type?: string; team_id?: string; event?: SlackEvent }): Promise<EnvelopeOutcome> => {
    if (doc.type !== "event_callback" || !doc.event) return "ack";
    try {
      await take(doc.team_id ?? "", doc.event);
      return "ack";
    } catch (err) {
      if (neverTaken(err)) {
        opts.logger.warn("a Slack message was refused; skipped", { error: String(err) });
        return "ack";
      }
      opts.logger.warn("a Slack event was not delivered; Slack will send it again", { error: String(err) });
      return "retry";
    }
  };

  const common = { botUser: auth.user_id, replies };
  if (opts.appToken) {
    const socket = new SocketModeClient({
      apiUrl: opts.apiUrl,
      appToken: opts.appToken,
      logger: opts.logger,
      refreshMs: opts.socketRefreshMs,
      onEvents: (payload) => callback((payload ?? {}) as Parameters<typeof callback>[0]),
      onInteractive: interactive,
    });
    await socket.start();
    return {
      ...common,
      mode: "socket" as const,
      port: 0,
      async close(): Promise<void> {
        gate.close();
        await socket.close();
        await replies.settle();
      },
    };
  }
  const server = await serveInbound(opts.listen, "/slack/events", handle, opts.logger);
  return {
    ...common,
    mode: "http" as const,
    port: server.port,
    async close(): Promise<void> {
      gate.close();
      await server.close();
      await replies.settle();
    },
  };
}

/** The Slack adapter: events by HTTP (signed) or by Socket Mode (an app token). */
export const slackAdapter: ChannelAdapter = {
  defaultDmPolicy: "pairing",
  missing: (a) =>
    !a.slackBotToken
      ? "set SLACK_BOT_TOKEN: the app's bot token (xoxb-...)"
      : !a.slackAppToken && !a.slackSigningSecret
        ? "set SLACK_SIGNING_SECRET (events by HTTP) or SLACK_APP_TOKEN (events by Socket Mode, an xapp- token)"
        : undefined,
  async start({ gateway, state, settings: a, channel, dm, logger }) {
    const app = await startSlackAdapter(gateway, state, {
      listen: a.webhookAddr,
      botToken: a.slackBotToken,
      signingSecret: a.slackSigningSecret,
      appToken: a.slackAppToken || undefined,
      socketRefreshMs: a.slackSocketRefreshMs,
      apiUrl: a.slackApiUrl,
      channel,
      commandUsers: new Set(a.commandUsers),
      dm,
      draftIntervalMs: a.draftIntervalMs,
      logger,
    });
    return {
      inbound: app,
      replies: app.replies,
      serving:
        app.mode === "socket"
          ? `slack adapter taking events by Socket Mode as ${app.botUser}`
          : `slack adapter taking events at POST /slack/events on port ${app.port} as ${app.botUser}`,
    };
  },
};
