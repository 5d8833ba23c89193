// The contract every channel adapter keeps (webhook.ts, telegram.ts, slack.ts), and what `troupe
// adapter KIND` gives it (cli/adapter.ts). An adapter turns its channel's messages into Deliver
// calls on the gateway and its replies (read from the inbox by InboxReplies) into the channel's
// own calls. Adding a channel is one file exporting a ChannelAdapter, and one line in registry.ts.
import type { Config } from "../shared/config/config-types.js";
import type { Logger } from "../shared/process/log.js";
import type { GatewayClient } from "./deliver.js";
import type { DmPolicy, DmSettings } from "./dm-gate.js";
import type { ReplySink } from "./replies.js";
import type { AdapterState } from "./state.js";

/** What an adapter starts with. */
export interface AdapterContext {
  gateway: GatewayClient;
  state: AdapterState;
  /** The operator's settings for adapters (TROUPE_ADAPTER_*, the channel's tokens). */
  settings: Config["adapter"];
  /** The channel name its sessions are routed by (--channel; default the adapter's kind). */
  channel: string;
  /** --account, for adapters that serve several (default: the adapter's kind). */
  account: string;
  /** Who may write in private (dm-gate.ts). */
  dm: DmSettings;
  logger: Logger;
}

/** A running adapter: its inbound side, where replies go, and what to log once it is up. */
export interface StartedAdapter {
  inbound: { close(): Promise<void> };
  replies: ReplySink;
  /** One line for the log: how it takes its channel's messages. */
  serving: string;
}

export interface ChannelAdapter {
  /** Its private messages' policy when TROUPE_ADAPTER_DM_POLICY is unset. */
  defaultDmPolicy: DmPolicy;
  /** What its settings lack, said as the fix ("set TELEGRAM_BOT_TOKEN: ..."); undefined when complete. */
  missing(settings: Config["adapter"]): string | undefined;
  /** Starts taking its channel's messages. May reject (the channel refused its token). */
  start(context: AdapterContext): Promise<StartedAdapter>;
}
