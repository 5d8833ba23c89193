// `troupe adapter telegram`: a Telegram bot by long polling (getUpdates) or by webhook
// (setWebhook). Each message becomes a Deliver. Polling, the update offset advances (and Telegram
// forgets the update) only once the gateway has it; by webhook, the 200 comes only then. Either
// way a bot killed mid-update gets it again, and the gateway's idempotency keys (chat:message)
// drop what it already had. In groups the bot takes what is addressed to it: a
// mention, a reply to one of its messages, or a /command. Replies: telegram-chat.ts; tool calls
// put to a person, and their buttons' presses: telegram-approvals.ts.
import type http from "node:http";
import { ChatType } from "../shared/gen/troupe/v1/inbound_pb.js";
import type { Logger } from "../shared/process/log.js";
import { BotApi, BotApiError, type TgMessage, type TgUpdate, type TgUser } from "./bot-api.js";
import { deliverFrom, neverTaken, type GatewayClient } from "./deliver.js";
import { MAX_IMAGE_BYTES, maxMediaBytes } from "../shared/media.js";
import { downloadUpTo } from "../shared/net/bounded-body.js";
import type { AdapterState, Address } from "./state.js";
import { DraftedReplies, sendText } from "./drafted-replies.js";
import { serveInbound, type InboundAnswer } from "./http-inbound.js";
import { equalSecrets } from "./signature.js";
import { telegramChat } from "./telegram-chat.js";
import { DmGate, type DmSettings } from "./dm-gate.js";
import type { ChannelAdapter } from "./channel-adapter.js";
import { telegramApprovals } from "./telegram-approvals.js";

export interface TelegramOptions {
  token: string;
  apiUrl: string;
  channel: string;
  /** Telegram user ids whose /commands act. */
  commandUsers: Set<string>;
  /** Who may write in private (dm-gate.ts). */
  dm: DmSettings;
  draftIntervalMs: number;
  /** Webhook mode (setWebhook): the public HTTPS URL Telegram POSTs to, its secret token, and where this process listens. */
  webhook?: { url: string; secret: string; listen: string };
  logger: Logger;
}

const POLL_TIMEOUT_S = 25;
/** Messages, and presses of the buttons of the bot's questions (telegram-approvals.ts). */
const ALLOWED_UPDATES = ["message", "callback_query"];
const CHAT_TYPES = {
  private: ChatType.DIRECT,
  group: ChatType.GROUP,
  supergroup: ChatType.GROUP,
  channel: ChatType.CHANNEL,
};

export async function startTelegramAdapter(gateway: GatewayClient, state: AdapterState, opts: TelegramOptions) {
  const api = new BotApi(opts.apiUrl, opts.token);
  let me: TgUser;
  try {
    me = await api.call<TgUser>("getMe");
  } catch (err) {
    if (err instanceof BotApiError && err.code === 401) throw new Error("the Bot API refused TELEGRAM_BOT_TOKEN (401)");
    throw err;
  }
  const chat = telegramChat(api);
  const approvals = telegramApprovals({
    api,
    gateway,
    state,
    channel: opts.channel,
    commandUsers: opts.commandUsers,
    logger: opts.logger,
  });
  const replies = new DraftedReplies(chat, state, opts.draftIntervalMs, opts.logger, approvals);
  /** One update: a message, or a press of one of the bot's buttons. */
  const takeUpdate = async (u: TgUpdate): Promise<void> => {
    if (u.message) await take(u.message);
    else if (u.callback_query) await approvals.pressed(u.callback_query);
  };
  const gate = await DmGate.start({
    ...opts.dm,
    tell: (to, text) => sendText(chat, to, text, [], () => undefined),
    logger: opts.logger,
  });
  const stop = new AbortController();
  let stopped = false;

  /** Whether a group message is for the bot. */
  const addressed = (m: TgMessage, text: string) =>
    m.chat.type === "private" ||
    (me.username !== undefined && text.toLowerCase().includes(`@${me.username.toLowerCase()}`)) ||
    m.reply_to_message?.from?.id === me.id ||
    text.startsWith("/");

  const take = async (m: TgMessage): Promise<void> => {
    if (!m.from || m.from.is_bot) return;
    const text = m.text ?? m.caption ?? "";
    if (!addressed(m, text)) return;
    const topic = m.is_topic_message && m.message_thread_id !== undefined ? String(m.message_thread_id) : "";
    const from: Address = {
      chat_id: String(m.chat.id),
      message_id: String(m.message_id),
      ...(topic ? { thread_id: topic } : {}),
    };
    // A private chat is the DM policy's: nothing of a sender it refuses goes further, not even
    // their files.
    if (m.chat.type === "private" && !(await gate.admit({ id: String(m.from.id), name: nameOf(m.from) }, from))) return;
    const peer = { id: String(m.chat.id), displayName: m.chat.title ?? nameOf(m.from) };
    const media = await mediaOf(api, opts.token, opts.apiUrl, m, opts.logger);
    try {
      const res = await deliverFrom(
        gateway,
        state,
        {
          idempotencyKey: `${m.chat.id}:${m.message_id}`,
          context: {
            channel: opts.channel,
            accountId: String(me.id),
            sender: { id: String(m.from.id), displayName: nameOf(m.from) },
            chatType: CHAT_TYPES[m.chat.type],
            peer,
            threadId: topic,
            parentPeer: topic ? peer : undefined,
            replyToId: m.reply_to_message ? String(m.reply_to_message.message_id) : "",
          },
          text,
          media,
          commandAuthorized: opts.commandUsers.has(String(m.from.id)),
        },
        from,
      );
      if (res.directiveReply) await sendText(chat, from, res.directiveReply, [], () => undefined);
    } catch (err) {
      if (!neverTaken(err)) throw err;
      opts.logger.warn("a Telegram message was refused; skipped", { chat: from.chat_id, error: String(err) });
    }
  };

  const poll = async (): Promise<void> => {
    let pauseMs = 1000;
    while (!stopped) {
      try {
        const offset = state.offset === "" ? undefined : Number(state.offset);
        const updates = await api.call<TgUpdate[]>(
          "getUpdates",
          { offset, timeout: POLL_TIMEOUT_S, allowed_updates: ALLOWED_UPDATES },
          stop.signal,
        );
        for (const u of updates) {
          await takeUpdate(u);
          state.offset = String(u.update_id + 1);
          await state.save();
        }
        pauseMs = 1000;
      } catch (err) {
        if (stopped) return;
        let waitMs = pauseMs;
        if (err instanceof BotApiError && err.retryAfterS) waitMs = err.retryAfterS * 1000;
        else if (err instanceof BotApiError && err.code === 409)
          opts.logger.error("Telegram refused getUpdates: a webhook is set or another instance polls", {
            error: err.description,
          });
        else opts.logger.warn("Telegram polling failed; trying again", { error: String(err), waitMs });
        await new Promise((r) => setTimeout(r, waitMs));
        pauseMs = Math.min(pauseMs * 2, 30_000);
      }
    }
  };
  /**
   * Webhook mode: Telegram POSTs each Update with the secret token in a header
   * (https://core.telegram.org/bots/api#setwebhook). A 2xx tells it the update is taken; anything
   * else, and it sends the update again later.
   */
  const hook = async (raw: Buffer, req: http.IncomingMessage): Promise<InboundAnswer> => {
    const secret = req.headers["x-telegram-bot-api-secret-token"];
    if (typeof secret !== "string" || !equalSecrets(secret, opts.webhook!.secret))
      return { status: 401, body: { error: "X-Telegram-Bot-Api-Secret-Token does not match" } };
    let update: TgUpdate;
    try {
      update = JSON.parse(raw.toString("utf8")) as TgUpdate;
    } catch {
      return { status: 400, body: { error: "the body is not JSON" } };
    }
    try {
      await takeUpdate(update);
      return { status: 200, body: {} };
    } catch (err) {
      opts.logger.warn("a Telegram update was not delivered; Telegram will send it again", { error: String(err) });
      return { status: 503, body: { error: "not delivered; retry" } };
    }
  };

  let running: Promise<void> | { close(): Promise<void> };
  if (opts.webhook) {
    const server = await serveInbound(opts.webhook.listen, "/telegram", hook, opts.logger);
    await api.call("setWebhook", {
      url: opts.webhook.url,
      secret_token: opts.webhook.secret,
      allowed_updates: ALLOWED_UPDATES,
    });
    running = server;
  } else {
    // A webhook left from an earlier setup would refuse every getUpdates.
    await api.call("deleteWebhook", { drop_pending_updates: false });
    running = poll();
  }

  return {
    username: me.username ?? String(me.id),
    mode: opts.webhook ? "webhook" : "polling",
    replies,
    async close(): Promise<void> {
      stopped = true;
      gate.close();
      stop.abort();
      await ("close" in running ? running.close() : running);
      await replies.settle();
    },
  };
}

const nameOf = (u: TgUser) => [u.first_name, u.last_name].filter(Boolean).join(" ") || u.username || String(u.id);

/**
 * A message's photo and document as media, downloaded here (getFile, then the file URL) because
 * that URL holds the bot's token and must not leave the adapter: the gateway gets the bytes under
 * a name without it. A photo: Telegram's largest size that fits MAX_IMAGE_BYTES; a document: when
 * it fits the workspace's MAX_ATTACHMENT_BYTES (an image document, MAX_IMAGE_BYTES), else by name.
 */
type Media = { url: string; mimeType: string; fileName: string; sizeBytes: bigint; data: Uint8Array };

async function mediaOf(api: BotApi, token: string, apiUrl: string, m: TgMessage, logger: Logger): Promise<Media[]> {
  /** The file's bytes; empty when it cannot be had (then the gateway names it only). */
  const download = async (fileId: string): Promise<Uint8Array> => {
    try {
      const file = await api.call<{ file_path?: string }>("getFile", { file_id: fileId });
      if (!file.file_path) return new Uint8Array();
      const url = `${apiUrl.replace(/\/$/, "")}/file/bot${token}/${file.file_path}`;
      return await downloadUpTo(url, { signal: AbortSignal.timeout(15_000) }, MAX_IMAGE_BYTES);
    } catch (err) {
      logger.warn("could not download a Telegram file; it goes in as a name only", { error: String(err) });
      return new Uint8Array();
    }
  };
  const out: Media[] = [];
  const photo = m.photo?.filter((p) => (p.file_size ?? 0) <= MAX_IMAGE_BYTES).at(-1);
  if (photo) {
    const data = await download(photo.file_id);
    out.push({
      url: `telegram:file/${photo.file_unique_id}`,
      mimeType: "image/jpeg",
      fileName: "photo.jpg",
      data,
      sizeBytes: BigInt(photo.file_size ?? 0),
    });
  }
  const doc = m.document;
  if (doc) {
    // A file small enough for the workspace (or an image for a vision model) comes with its bytes.
    const fetchIt = (doc.file_size ?? 0) <= maxMediaBytes(doc.mime_type);
    out.push({
      url: `telegram:file/${doc.file_id}`,
      mimeType: doc.mime_type ?? "",
      fileName: doc.file_name ?? "",
      sizeBytes: BigInt(doc.file_size ?? 0),
      data: fetchIt ? await download(doc.file_id) : new Uint8Array(),
    });
  }
  return out;
}

/** The Telegram adapter (Bot API): long polling, or a webhook when TELEGRAM_WEBHOOK_URL is set. */
export const telegramAdapter: ChannelAdapter = {
  defaultDmPolicy: "pairing",
  missing: (a) =>
    !a.telegramBotToken
      ? "set TELEGRAM_BOT_TOKEN: the bot's token from BotFather"
      : a.telegramWebhookUrl && !a.telegramWebhookSecret
        ? "set TELEGRAM_WEBHOOK_SECRET with TELEGRAM_WEBHOOK_URL: without it anyone could post updates"
        : undefined,
  async start({ gateway, state, settings: a, channel, dm, logger }) {
    const bot = await startTelegramAdapter(gateway, state, {
      token: a.telegramBotToken,
      apiUrl: a.telegramApiUrl,
      channel,
      commandUsers: new Set(a.commandUsers),
      dm,
      draftIntervalMs: a.draftIntervalMs,
      webhook: a.telegramWebhookUrl
        ? { url: a.telegramWebhookUrl, secret: a.telegramWebhookSecret, listen: a.webhookAddr }
        : undefined,
      logger,
    });
    return {
      inbound: bot,
      replies: bot.replies,
      serving: `telegram adapter ${bot.mode === "webhook" ? "taking its webhook" : "polling"} as @${bot.username}`,
    };
  },
};
