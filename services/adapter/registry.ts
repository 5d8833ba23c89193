// The channel adapters `troupe adapter KIND` can run, by kind (channel-adapter.ts says what one
// is). Each is loaded only when asked for: an adapter process runs one.
import type { ChannelAdapter } from "./channel-adapter.js";

export const CHANNEL_ADAPTERS: Record<string, () => Promise<ChannelAdapter>> = {
  webhook: async () => (await import("./webhook.js")).webhookAdapter,
  telegram: async () => (await import("./telegram.js")).telegramAdapter,
  slack: async () => (await import("./slack.js")).slackAdapter,
};
