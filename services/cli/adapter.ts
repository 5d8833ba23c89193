// `troupe adapter KIND`: a channel adapter (services/adapter/registry.ts), its own process and a client of the
// gateway under an adapter key (TROUPE_API_KEY). It keeps nothing but its state file, so it may be
// killed and started again at any moment (docs/channels.md). SIGTERM and SIGINT stop it cleanly.
import path from "node:path";
import { loadConfig } from "../shared/config/config.js";
import { useOutboundProxy } from "../shared/net/outbound-proxy.js";
import { exitProcess } from "../shared/process/exit.js";
import { createLogger } from "../shared/process/log.js";
import { InboxReplies } from "../adapter/replies.js";
import { AdapterState } from "../adapter/state.js";
import { CHANNEL_ADAPTERS } from "../adapter/registry.js";
import { CLIENT_FLAGS, gatewayClient } from "./gateway-client.js";
import type { DmSettings } from "../adapter/dm-gate.js";
import { sharedDmWarnings } from "./shared-dms.js";
import type { Config } from "../shared/config/config-types.js";
import type { Logger } from "../shared/process/log.js";

export async function adapterCommand(args: string[]): Promise<number> {
  const kind = args[0];
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
  const load = CHANNEL_ADAPTERS[kind];
  if (!load) return fail(`no such adapter (${Object.keys(CHANNEL_ADAPTERS).join(", ")})`);
  const adapter = await load();
  if (!cfg.clientApiKey)
    return fail("set TROUPE_API_KEY to an adapter key (troupe keys create --role adapter --channel NAME)");
  const a = cfg.adapter;
  const missing = adapter.missing(a);
  if (missing) return fail(missing);
  const channel = String(cfg.flags.channel ?? kind);
  const logger = createLogger(`adapter-${kind}`, cfg.logLevel, cfg.logFormat);
  const stateFile = a.stateFile || path.join(cfg.dataDir, "adapters", `${kind}.json`);
  const state = await AdapterState.load(stateFile);
  // Private messages: the public adapters let in only whom the operator approved, by default.
  const dm: DmSettings = {
    policy: a.dmPolicy ?? adapter.defaultDmPolicy,
    allowFrom: new Set([...a.allowFrom, ...a.commandUsers]),
    stateFile,
  };
  warnOfSharedDms(cfg, channel, dm.policy, logger);
  const gateway = await gatewayClient(cfg, { throughProxy: false });
  const {
    inbound,
    replies: sink,
    serving,
  } = await adapter.start({
    gateway,
    state,
    settings: a,
    channel,
    account: String(cfg.flags.account ?? kind),
    dm,
    logger,
  });
  logger.info(serving);
  const replies = new InboxReplies(gateway, state, sink, logger);
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
  setTimeout(() => void exitProcess(0), 2000).unref();
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
