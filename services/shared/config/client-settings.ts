// The settings of what runs beside the services: the troupe CLI's client commands, the scripted
// model server, and the channel adapters (docs/channels.md). Sections of settings.ts.
import { address, int, positive, type Setting } from "./setting-kinds.js";

export const CLIENT_SETTINGS = {
  clientApiKey: {
    env: "TROUPE_API_KEY",
    doc: "the key troupe chat sends",
    default: "<data-dir>/auth/dev-key",
    secret: true,
  },
  tlsCa: {
    env: "TROUPE_TLS_CA",
    flag: "ca",
    doc: "troupe chat: reach the gateway over TLS, trusting this CA (PEM); --tls trusts the system's",
  },
  modelServer: address("TROUPE_MODEL_SERVER_ADDR", "model-server", "scripted model server", 50060),
  scriptedTokenRate: {
    env: "TROUPE_SCRIPTED_TOKEN_RATE",
    doc: "the scripted model's tokens a second (unset: as fast as read)",
    schema: positive,
  },
} as const satisfies Record<string, Setting>;

export const ADAPTER_SETTINGS = {
  adapterState: {
    env: "TROUPE_ADAPTER_STATE",
    flag: "state",
    doc: "troupe adapter: its state file (inbox cursor, the platform's offset, chats of runs, posted replies)",
    default: "<data-dir>/adapters/<kind>.json",
  },
  webhookAddr: {
    env: "TROUPE_WEBHOOK_ADDR",
    flag: "listen",
    doc: "troupe adapter webhook, slack and telegram (webhook mode): where it takes the platform's POSTs",
    default: "127.0.0.1:8090",
  },
  webhookSecret: {
    env: "TROUPE_WEBHOOK_SECRET",
    doc: "troupe adapter webhook: the HMAC key of inbound and reply signatures (docs/channels.md)",
    secret: true,
  },
  webhookReplyUrl: {
    env: "TROUPE_WEBHOOK_REPLY_URL",
    flag: "reply-url",
    doc: "troupe adapter webhook: where replies are POSTed",
    schema: { type: "string", pattern: "^https?://", message: "must be an http:// or https:// URL" },
  },
  telegramBotToken: {
    env: "TELEGRAM_BOT_TOKEN",
    doc: "troupe adapter telegram: the bot's token (BotFather)",
    secret: true,
  },
  telegramApiUrl: {
    env: "TELEGRAM_API_URL",
    doc: "troupe adapter telegram: the Bot API server (a local one, or a test's)",
    default: "https://api.telegram.org",
    schema: { type: "string", pattern: "^https?://", message: "must be an http:// or https:// URL" },
  },
  telegramWebhookUrl: {
    env: "TELEGRAM_WEBHOOK_URL",
    doc: "troupe adapter telegram: set for webhook mode, the public HTTPS URL Telegram POSTs to (proxied to TROUPE_WEBHOOK_ADDR, path /telegram); unset: long polling",
    schema: {
      type: "string",
      pattern: "^https://",
      message: "must be an https:// URL (Telegram calls only HTTPS webhooks)",
    },
  },
  telegramWebhookSecret: {
    env: "TELEGRAM_WEBHOOK_SECRET",
    doc: "troupe adapter telegram: the webhook's secret token (1-256 of A-Z a-z 0-9 _ -), checked on every update",
    schema: { type: "string", pattern: "^[A-Za-z0-9_-]{1,256}$", message: "must be 1-256 of A-Z a-z 0-9 _ -" },
    secret: true,
  },
  slackBotToken: {
    env: "SLACK_BOT_TOKEN",
    doc: "troupe adapter slack: the app's bot token (xoxb-...)",
    secret: true,
  },
  slackSigningSecret: {
    env: "SLACK_SIGNING_SECRET",
    doc: "troupe adapter slack: the app's signing secret, to check the Events API's requests",
    secret: true,
  },
  slackAppToken: {
    env: "SLACK_APP_TOKEN",
    doc: "troupe adapter slack: an app-level token (xapp-..., scope connections:write); set, events come by Socket Mode instead of HTTP",
    schema: { type: "string", pattern: "^xapp-", message: "must be an app-level token (xapp-...)" },
    secret: true,
  },
  slackSocketRefreshMs: {
    env: "TROUPE_SLACK_SOCKET_REFRESH_MS",
    doc: "troupe adapter slack, Socket Mode: how long one connection is kept before a new one replaces it (bounds how long a silently dropped one goes unnoticed; 0: until Slack closes it)",
    default: 300000,
    schema: int(0),
  },
  slackApiUrl: {
    env: "SLACK_API_URL",
    doc: "troupe adapter slack: the Web API's base (a test's server)",
    default: "https://slack.com/api",
    schema: { type: "string", pattern: "^https?://", message: "must be an http:// or https:// URL" },
  },
  commandUsers: {
    env: "TROUPE_ADAPTER_COMMAND_USERS",
    doc: "troupe adapter: the platform user ids whose /commands act (comma-separated; unset: nobody's); they may also write in private whatever the DM policy",
  },
  dmPolicy: {
    env: "TROUPE_ADAPTER_DM_POLICY",
    doc: "troupe adapter: who may write to the agent in private: open (anyone), allowlist (TROUPE_ADAPTER_ALLOW_FROM only) or pairing (those, and strangers the operator approves with troupe pairing approve CODE)",
    default: "<pairing for telegram and slack, open for webhook>",
    schema: { enum: ["open", "allowlist", "pairing"], message: "must be one of open, allowlist, pairing" },
  },
  allowFrom: {
    env: "TROUPE_ADAPTER_ALLOW_FROM",
    doc: "troupe adapter: platform user ids let in to write in private under any DM policy (comma-separated)",
  },
  draftIntervalMs: {
    env: "TROUPE_ADAPTER_DRAFT_INTERVAL_MS",
    doc: "troupe adapter: least time between edits of a streaming reply, per message",
    default: 1000,
    schema: int(100),
  },
} as const satisfies Record<string, Setting>;
