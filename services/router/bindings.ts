// Routing of channel messages, after OpenClaw's rules: bindings in configuration pick the agent,
// most specific tier first; the session key follows from the agent, the chat type and the
// configured dm_scope; identity links make one person's ids on several channels one sender.
//
// The configuration (JSON, TROUPE_ROUTING_FILE or <data-dir>/routing.json; its schema:
// shared/schemas/routing.schema.json):
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
//
// Direct messages are private by default (`per-channel-peer`): each sender of each channel has a
// session of their own. `main` (every DM in one session) is an operator's explicit choice, and
// `troupe config validate` warns of it: strangers writing to a public bot would read each other.
import { createHash } from "node:crypto";
import { ChatType, RouteTier, type ChannelContext } from "../shared/gen/troupe/v1/inbound_pb.js";
import { parseJson, schemaProblems } from "../shared/json-schema.js";

export type DmScope = "main" | "per-peer" | "per-channel-peer" | "per-account-channel-peer";

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
  /** A direct message in the one session every sender's direct messages share (dmScope main). */
  sharedDm: boolean;
}

/**
 * Parses and checks a routing configuration: its schema (shared/schemas/routing.schema.json),
 * then what a schema cannot say. Throws with the place of every problem.
 */
export function parseRouting(text: string, source: string): RoutingConfig {
  const doc = parseJson(text, source);
  const fail = (problems: string[]): never => {
    throw new Error(`${source}: ${problems.join("; ")}`);
  };
  const schemaSays = schemaProblems("routing", doc);
  if (schemaSays.length > 0) fail(schemaSays);
  const d = doc as {
    defaultAgent?: string;
    session?: { dmScope?: DmScope; mainKey?: string; identityLinks?: Record<string, string[]> };
    bindings?: Binding[];
  };
  const problems: string[] = [];
  const identityLinks = new Map<string, string>();
  for (const [person, ids] of Object.entries(d.session?.identityLinks ?? {})) {
    for (const id of ids) {
      const earlier = identityLinks.get(id);
      if (earlier !== undefined)
        problems.push(`session.identityLinks.${person} repeats ${id}, already linked to ${earlier}`);
      else identityLinks.set(id, person);
    }
  }
  const bindings = d.bindings ?? [];
  for (const [i, b] of bindings.entries())
    if (b.match.roles !== undefined && b.match.guildId === undefined)
      problems.push(`bindings[${i}].match.roles needs match.guildId`);
  if (problems.length > 0) fail(problems);
  return {
    defaultAgent: d.defaultAgent ?? "main",
    dmScope: d.session?.dmScope ?? DEFAULT_DM_SCOPE,
    mainKey: d.session?.mainKey ?? "main",
    identityLinks,
    bindings,
  };
}

/** Each sender of each channel in a session of their own, unless the operator says otherwise. */
export const DEFAULT_DM_SCOPE: DmScope = "per-channel-peer";

export const EMPTY_ROUTING: RoutingConfig = {
  defaultAgent: "main",
  dmScope: DEFAULT_DM_SCOPE,
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

/**
 * Session key parts must fit session ids' alphabet; anything else is replaced by its hash. The
 * two forms never meet: a part that merely looks like a hash (`x` and 16 hex digits, which a
 * stranger may choose as a webhook sender id) is hashed too, so no chosen id lands in the session
 * of the id whose hash it spells.
 */
function part(s: string): string {
  return /^[A-Za-z0-9._-]{1,64}$/.test(s) && !HASHED_PART.test(s)
    ? s
    : `x${createHash("sha256").update(s).digest("hex").slice(0, 16)}`;
}
const HASHED_PART = /^x[0-9a-f]{16}$/;

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
    return {
      agentId,
      tier,
      sessionKey: this.sessionKey(agentId, dmScope, ctx, linked ?? senderId),
      canonicalSender,
      sharedDm: ctx.chatType === ChatType.DIRECT && dmScope === "main",
    };
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
