// Warnings for a routing that puts direct messages of several people in one session
// (dmScope `main`): the operator may mean it (a bot of one person), but with strangers writing in
// private it is every stranger reading every other (router/bindings.ts). `troupe config validate`
// and an adapter's start say so.
import { existsSync, readFileSync } from "node:fs";
import { parseRouting, type RoutingConfig } from "../router/bindings.js";

/** Where the configuration shares DMs: "session.dmScope", or the bindings that do, per channel. */
export function sharedDmScopes(routing: RoutingConfig): { where: string; channel?: string }[] {
  const out: { where: string; channel?: string }[] = [];
  if (routing.dmScope === "main") out.push({ where: "session.dmScope" });
  for (const [i, b] of routing.bindings.entries())
    if (b.dmScope === "main") out.push({ where: `bindings[${i}].dmScope`, channel: b.match.channel });
  return out;
}

/** What `troupe config validate` adds for a routing file: one line per place that shares DMs. */
export function routingWarnings(routing: RoutingConfig, file: string): string[] {
  return sharedDmScopes(routing).map(
    ({ where, channel }) =>
      `${file}: ${where} is main: every direct message${channel ? ` on ${channel}` : ""} goes to one shared session, where each sender reads the others; keep it only where every private sender is trusted (TROUPE_ADAPTER_DM_POLICY allowlist or pairing), or use per-channel-peer, the default`,
  );
}

/**
 * An adapter's start: warnings when the routing file on this machine (if any) shares the
 * channel's DMs while its DM policy lets anyone write.
 */
export function sharedDmWarnings(routingFile: string, adapters: { channel: string; policy: string }[]): string[] {
  if (!existsSync(routingFile)) return [];
  let routing: RoutingConfig;
  try {
    routing = parseRouting(readFileSync(routingFile, "utf8"), routingFile);
  } catch {
    return []; // the router says what is wrong with it
  }
  const scopes = sharedDmScopes(routing);
  return adapters
    .filter((a) => a.policy === "open" && scopes.some((s) => s.channel === undefined || s.channel === a.channel))
    .map(
      (a) =>
        `${a.channel} adapter: ${routingFile} puts every direct message in one shared session (dmScope main) and TROUPE_ADAPTER_DM_POLICY is open: strangers writing to the bot read each other's conversation`,
    );
}
