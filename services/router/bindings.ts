// Routing of channel messages, after OpenClaw's rules: bindings in configuration pick the agent,
// most specific tier first; the session key follows from the agent, the chat type and the
// configured dm_scope; identity links make one person's ids on several channels one sender.
//
// The configuration (JSON, TROUPE_ROUTING_FILE or <data-dir>/routing.json):
//   {
//     "defaultAgent": "main",
//     "session": { "dmScope": "per-channel-peer", "mainKey": "main",
//                  "identityLinks": { "alice": ["telegram:123", "discord:987"] } },
//     "bindings": [
//       { "agent": "support", "match": { "channel": "discord", "guildId": "g1", "roles": ["mod"] } },
//       { "agent": "sales", "match": { "channel": "telegram", "accountId": "salesbot" },
//         "dmScope": "per-peer" }
//     ]
//   }
// A binding's match fields are ANDed. Its tier is set by its most specific field: an exact peer
// (also matched against a thread's parent chat, one tier lower), a peer wildcard (`"id": "*"`),
// guild and roles, guild, team, a named account, the channel alone (accountId absent or "*").
// Within a tier the first binding in configuration order wins; with none, the default agent.
import { createHash } from "node:crypto";
import { ChatType, RouteTier, type ChannelContext } from "../shared/gen/troupe/v1/inbound_pb.js";
import { CHANNEL_NAME, isAgentId } from "../shared/ids.js";

export type DmScope = "main" | "per-peer" | "per-channel-peer" | "per-account-channel-peer";
const DM_SCOPES: readonly DmScope[] = ["main", "per-peer", "per-channel-peer", "per-account-channel-peer"];

interface PeerMatch {
  kind?: "direct" | "group" | "channel";
  id: string;
}

export interface Binding {
  agent: string;
  match: {
    channel: string;
    accountId?: string;
    peer?: PeerMatch;
    guildId?: string;
    roles?: string[];
    teamId?: string;
  };
  dmScope?: DmScope;
}

export interface RoutingConfig {
  defaultAgent: string;
  dmScope: DmScope;
  mainKey: string;
  /** "channel:id" -> the person's canonical name. */
  identityLinks: Map<string, string>;
  bindings: Binding[];
}

export interface Route {
  agentId: string;
  tier: RouteTier;
  sessionKey: string;
  canonicalSender: string;
}

/** Parses and checks a routing configuration; throws with the path of the first problem. */
export function parseRouting(text: string, source: string): RoutingConfig {
  let doc: Record<string, unknown>;
  try {
    doc = JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    throw new Error(`${source}: not JSON (${(err as Error).message})`);
  }
  const fail = (where: string, what: string): never => {
    throw new Error(`${source}: ${where} ${what}`);
  };
  const session = (doc.session ?? {}) as Record<string, unknown>;
  const dmScope = (session.dmScope ?? "main") as DmScope;
  if (!DM_SCOPES.includes(dmScope)) fail("session.dmScope", `must be one of ${DM_SCOPES.join(", ")}`);
  const defaultAgent = (doc.defaultAgent ?? "main") as string;
  if (typeof defaultAgent !== "string" || !isAgentId(defaultAgent)) fail("defaultAgent", "is not a valid agent id");
  const mainKey = (session.mainKey ?? "main") as string;
  if (typeof mainKey !== "string" || !/^[a-z0-9_-]{1,32}$/.test(mainKey))
    fail("session.mainKey", "must be 1-32 of a-z 0-9 _ -");
  const identityLinks = new Map<string, string>();
  for (const [person, ids] of Object.entries((session.identityLinks ?? {}) as Record<string, unknown>)) {
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(person))
      fail(`session.identityLinks.${person}`, "is not a valid name (1-64 of A-Z a-z 0-9 . _ -)");
    if (!Array.isArray(ids)) fail(`session.identityLinks.${person}`, 'must be a list of "channel:id"');
    for (const id of ids as unknown[]) {
      if (typeof id !== "string" || !/^[a-z0-9_-]{1,32}:.+$/.test(id))
        fail(`session.identityLinks.${person}`, `has ${JSON.stringify(id)}, not "channel:id"`);
      if (identityLinks.has(id as string))
        fail(
          `session.identityLinks.${person}`,
          `repeats ${id as string}, already linked to ${identityLinks.get(id as string)}`,
        );
      identityLinks.set(id as string, person);
    }
  }
  const bindings = ((doc.bindings ?? []) as unknown[]).map((raw, i): Binding => {
    const where = `bindings[${i}]`;
    const b = raw as Record<string, unknown>;
    if (typeof b !== "object" || b === null) fail(where, "must be an object");
    if (typeof b.agent !== "string" || !isAgentId(b.agent)) fail(`${where}.agent`, "is not a valid agent id");
    const m = (b.match ?? {}) as Record<string, unknown>;
    if (typeof m.channel !== "string" || !CHANNEL_NAME.test(m.channel))
      fail(`${where}.match.channel`, "is required: 1-32 of a-z 0-9 _ -");
    for (const f of ["accountId", "guildId", "teamId"])
      if (m[f] !== undefined && (typeof m[f] !== "string" || m[f] === ""))
        fail(`${where}.match.${f}`, "must be a non-empty string");
    if (
      m.roles !== undefined &&
      (!Array.isArray(m.roles) || m.roles.length === 0 || !m.roles.every((r) => typeof r === "string"))
    )
      fail(`${where}.match.roles`, "must be a non-empty list of strings");
    if (m.roles !== undefined && m.guildId === undefined) fail(`${where}.match.roles`, "needs match.guildId");
    const peer = m.peer as PeerMatch | undefined;
    if (
      peer !== undefined &&
      (typeof peer !== "object" ||
        typeof peer.id !== "string" ||
        peer.id === "" ||
        (peer.kind !== undefined && !["direct", "group", "channel"].includes(peer.kind)))
    ) {
      fail(`${where}.match.peer`, 'must be {"kind": "direct"|"group"|"channel", "id": "..." or "*"}');
    }
    if (b.dmScope !== undefined && !DM_SCOPES.includes(b.dmScope as DmScope))
      fail(`${where}.dmScope`, `must be one of ${DM_SCOPES.join(", ")}`);
    return { agent: b.agent as string, match: m as Binding["match"], dmScope: b.dmScope as DmScope | undefined };
  });
  return { defaultAgent, dmScope, mainKey, identityLinks, bindings };
}

export const EMPTY_ROUTING: RoutingConfig = {
  defaultAgent: "main",
  dmScope: "main",
  mainKey: "main",
  identityLinks: new Map(),
  bindings: [],
};

/** The tier a binding belongs to: its most specific match field. */
function tierOf(b: Binding): RouteTier {
  const m = b.match;
  if (m.peer) return m.peer.id === "*" ? RouteTier.PEER_WILDCARD : RouteTier.PEER;
  if (m.guildId && m.roles) return RouteTier.GUILD_ROLES;
  if (m.guildId) return RouteTier.GUILD;
  if (m.teamId) return RouteTier.TEAM;
  if (m.accountId && m.accountId !== "*") return RouteTier.ACCOUNT;
  return RouteTier.CHANNEL;
}

const KIND_OF: Record<ChatType, PeerMatch["kind"] | undefined> = {
  [ChatType.UNSPECIFIED]: undefined,
  [ChatType.DIRECT]: "direct",
  [ChatType.GROUP]: "group",
  [ChatType.CHANNEL]: "channel",
};

/** Whether every field the binding lists holds for the message (the peer as the tier says). */
function matches(b: Binding, tier: RouteTier, ctx: ChannelContext): boolean {
  const m = b.match;
  if (m.guildId !== undefined && m.guildId !== ctx.guildId) return false;
  if (m.roles !== undefined && !m.roles.some((r) => ctx.roles.includes(r))) return false;
  if (m.teamId !== undefined && m.teamId !== ctx.teamId) return false;
  if (m.peer) {
    const kind = KIND_OF[ctx.chatType];
    if (tier === RouteTier.PARENT_PEER) return ctx.parentPeer !== undefined && ctx.parentPeer.id === m.peer.id;
    if (m.peer.kind !== undefined && m.peer.kind !== kind) return false;
    if (m.peer.id !== "*" && m.peer.id !== ctx.peer?.id) return false;
  }
  return true;
}

/** Session key parts must fit session ids' alphabet; anything else is replaced by its hash. */
function part(s: string): string {
  return /^[A-Za-z0-9._-]{1,64}$/.test(s) ? s : `x${createHash("sha256").update(s).digest("hex").slice(0, 16)}`;
}

const TIERS = [
  RouteTier.PEER,
  RouteTier.PARENT_PEER,
  RouteTier.PEER_WILDCARD,
  RouteTier.GUILD_ROLES,
  RouteTier.GUILD,
  RouteTier.TEAM,
  RouteTier.ACCOUNT,
  RouteTier.CHANNEL,
];

/**
 * Resolves channel messages with a configuration. The bindings that can apply to a (channel,
 * account) pair are worked out once and kept in a bounded LRU cache; a new configuration
 * replaces the resolver (and so its cache).
 */
export class InboundRouter {
  private readonly byTier = new Map<RouteTier, Binding[]>();
  private readonly cache = new Map<string, Map<RouteTier, Binding[]>>();

  constructor(
    readonly config: RoutingConfig,
    private readonly capacity = 1024,
  ) {
    for (const b of config.bindings) {
      const t = tierOf(b);
      (this.byTier.get(t) ?? this.byTier.set(t, []).get(t)!).push(b);
      // An exact peer binding also serves threads of that peer, one tier lower.
      if (t === RouteTier.PEER)
        (
          this.byTier.get(RouteTier.PARENT_PEER) ??
          this.byTier.set(RouteTier.PARENT_PEER, []).get(RouteTier.PARENT_PEER)!
        ).push(b);
    }
  }

  /** The bindings that can apply on this channel and account, by tier, in configuration order. */
  candidates(channel: string, accountId: string): Map<RouteTier, Binding[]> {
    const key = `${channel}\0${accountId}`;
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit;
    }
    const out = new Map<RouteTier, Binding[]>();
    for (const [tier, list] of this.byTier) {
      const fit = list.filter(
        (b) =>
          b.match.channel === channel &&
          (b.match.accountId === undefined || b.match.accountId === "*" || b.match.accountId === accountId),
      );
      if (fit.length > 0) out.set(tier, fit);
    }
    this.cache.set(key, out);
    if (this.cache.size > this.capacity) this.cache.delete(this.cache.keys().next().value!);
    return out;
  }

  get cached(): number {
    return this.cache.size;
  }

  resolve(ctx: ChannelContext): Route {
    const channel = ctx.channel;
    const candidates = this.candidates(channel, ctx.accountId);
    let agentId = this.config.defaultAgent;
    let tier = RouteTier.DEFAULT;
    let dmScope = this.config.dmScope;
    search: for (const t of TIERS) {
      for (const b of candidates.get(t) ?? []) {
        if (matches(b, t, ctx)) {
          agentId = b.agent;
          tier = t;
          dmScope = b.dmScope ?? dmScope;
          break search;
        }
      }
    }
    const senderId = ctx.sender?.id ?? "";
    const linked = this.config.identityLinks.get(`${channel}:${senderId}`);
    const canonicalSender = linked ?? `${channel}:${senderId}`;
    return { agentId, tier, sessionKey: this.sessionKey(agentId, dmScope, ctx, linked ?? senderId), canonicalSender };
  }

  private sessionKey(agent: string, dmScope: DmScope, ctx: ChannelContext, person: string): string {
    let key: string;
    if (ctx.chatType === ChatType.DIRECT) {
      key =
        dmScope === "main"
          ? `agent:${agent}:${this.config.mainKey}`
          : dmScope === "per-peer"
            ? `agent:${agent}:dm:${part(person)}`
            : dmScope === "per-channel-peer"
              ? `agent:${agent}:${part(ctx.channel)}:dm:${part(person)}`
              : `agent:${agent}:${part(ctx.channel)}:${part(ctx.accountId || "default")}:dm:${part(person)}`;
    } else {
      const kind = ctx.chatType === ChatType.CHANNEL ? "channel" : "group";
      key = `agent:${agent}:${part(ctx.channel)}:${kind}:${part(ctx.peer?.id ?? "")}`;
    }
    if (ctx.threadId) key += `:thread:${part(ctx.threadId)}`;
    // Session ids are at most 128 characters: a longer key is kept whole in its hash.
    return key.length <= 128 ? key : `agent:${agent}:h:${createHash("sha256").update(key).digest("hex").slice(0, 32)}`;
  }
}
