// `troupe adapter webhook|telegram|slack`: a channel adapter, its own process and a client of the
// gateway under an adapter key (TROUPE_API_KEY). It keeps nothing but its state file, so it may be
// killed and started again at any moment (docs/channels.md). SIGTERM and SIGINT stop it cleanly.
import path from "node:path";
import { loadConfig } from "../shared/config/config.js";
import { useOutboundProxy } from "../shared/net/outbound-proxy.js";
import { createLogger } from "../shared/process/log.js";
import { InboxReplies } from "../adapter/replies.js";
import { AdapterState } from "../adapter/state.js";
import { startWebhookAdapter, webhookReplies } from "../adapter/webhook.js";
import { startTelegramAdapter } from "../adapter/telegram.js";
import { startSlackAdapter } from "../adapter/slack.js";
import { CLIENT_FLAGS, gatewayClient } from "./gateway-client.js";
import type { DmSettings } from "../adapter/dm-gate.js";
import { sharedDmWarnings } from "./shared-dms.js";
import type { Config } from "../shared/config/config-types.js";
import type { Logger } from "../shared/process/log.js";

export async function adapterCommand(args: string[]): Promise<number> {
  const kind = args[0] as "webhook" | "telegram" | "slack";
  const cfg = loadConfig(args.slice(1), undefined, {
    channel: { type: "string" },
    account: { type: "string" },
    ...CLIENT_FLAGS,
  });
  useOutboundProxy(cfg.outboundProxy);
  const fail = (line: string) => {
    process.stderr.write(`troupe adapter ${kind}: ${line}\n`);
    return 2;
  };
  if (!cfg.clientApiKey)
    return fail("set TROUPE_API_KEY to an adapter key (troupe keys create --role adapter --channel NAME)");
  const a = cfg.adapter;
  const channel = String(cfg.flags.channel ?? kind);
  const logger = createLogger(`adapter-${kind}`, cfg.logLevel, cfg.logFormat);
  const stateFile = a.stateFile || path.join(cfg.dataDir, "adapters", `${kind}.json`);
  const state = await AdapterState.load(stateFile);
  // Private messages: the public adapters let in only whom the operator approved, by default.
  const dm: DmSettings = {
    policy: a.dmPolicy ?? (kind === "webhook" ? "open" : "pairing"),
    allowFrom: new Set([...a.allowFrom, ...a.commandUsers]),
    stateFile,
  };
  warnOfSharedDms(cfg, channel, dm.policy, logger);
  const gateway = await gatewayClient(cfg, { throughProxy: false });
  let inbound: { close(): Promise<void> };
  let replies: InboxReplies;
  if (kind === "webhook") {
    if (!a.webhookSecret) return fail("set TROUPE_WEBHOOK_SECRET: the key both sides sign with");
    if (!a.webhookReplyUrl) return fail("set TROUPE_WEBHOOK_REPLY_URL (or --reply-url): where replies go");
    const opts = {
      listen: a.webhookAddr,
      secret: a.webhookSecret,
      replyUrl: a.webhookReplyUrl,
      channel,
      accountId: String(cfg.flags.account ?? "webhook"),
      logger,
    };
    const server = await startWebhookAdapter(gateway, state, opts);
    logger.info(`webhook adapter taking POST /messages on port ${server.port}; replies to ${a.webhookReplyUrl}`);
    inbound = server;
    replies = new InboxReplies(gateway, state, webhookReplies(opts), logger);
  } else if (kind === "slack") {
    if (!a.slackBotToken) return fail("set SLACK_BOT_TOKEN: the app's bot token (xoxb-...)");
    if (!a.slackAppToken && !a.slackSigningSecret)
      return fail(
        "set SLACK_SIGNING_SECRET (events by HTTP) or SLACK_APP_TOKEN (events by Socket Mode, an xapp- token)",
      );
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
    logger.info(
      app.mode === "socket"
        ? `slack adapter taking events by Socket Mode as ${app.botUser}`
        : `slack adapter taking events at POST /slack/events on port ${app.port} as ${app.botUser}`,
    );
    inbound = app;
    replies = new InboxReplies(gateway, state, app.replies, logger);
  } else {
    if (!a.telegramBotToken) return fail("set TELEGRAM_BOT_TOKEN: the bot's token from BotFather");
    if (a.telegramWebhookUrl && !a.telegramWebhookSecret)
      return fail("set TELEGRAM_WEBHOOK_SECRET with TELEGRAM_WEBHOOK_URL: without it anyone could post updates");
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
    logger.info(`telegram adapter ${bot.mode === "webhook" ? "taking its webhook" : "polling"} as @${bot.username}`);
    inbound = bot;
    replies = new InboxReplies(gateway, state, bot.replies, logger);
  }
  replies.start();
  await new Promise<void>((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  await inbound.close();
  await replies.stop();
  await state.close();
  gateway.close();
  // Everything is closed; a connection whose far side never answers our close (a Socket Mode
  // socket gone silent) would keep the process alive, so it is left to the exit.
  setTimeout(() => process.exit(), 2000).unref();
  return 0;
}

/**
 * Says so at start when this adapter's direct messages from anyone land in one shared session (a
 * routing file on this machine whose dmScope is main for this channel) and its policy lets
 * strangers in: they would read each other's conversation.
 */
function warnOfSharedDms(cfg: Config, channel: string, policy: DmSettings["policy"], logger: Logger): void {
  for (const line of sharedDmWarnings(cfg.routingFile, [{ channel, policy }])) logger.warn(line);
  if (policy === "open")
    logger.warn(
      `${channel} adapter: TROUPE_ADAPTER_DM_POLICY=open: anyone may write to the agent in private (pairing or allowlist keep strangers out)`,
    );
}
