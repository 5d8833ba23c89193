// The router's rules for channel messages: each binding tier, first match by configuration order,
// every dm_scope, groups, channels and threads, identity links, the (channel, account) cache, and
// configurations that are refused with the place of the mistake.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { InboundRouter, parseRouting } from "../../services/router/bindings.js";
import { ChannelContextSchema, ChatType, RouteTier } from "../../services/shared/gen/troupe/v1/inbound_pb.js";

const config = (doc: unknown) => parseRouting(JSON.stringify(doc), "routing.json");
const ctx = (c: MessageInitShape<typeof ChannelContextSchema>) =>
  create(ChannelContextSchema, {
    chatType: ChatType.DIRECT,
    sender: { id: "u1" },
    peer: { id: "u1" },
    ...c,
  } as MessageInitShape<typeof ChannelContextSchema>);

describe("bindings, most specific tier first", () => {
  const router = new InboundRouter(
    config({
      defaultAgent: "fallback",
      bindings: [
        // Listed least specific first: the tier, not the order, decides between tiers.
        { agent: "by-channel", match: { channel: "discord" } },
        { agent: "by-account", match: { channel: "discord", accountId: "bot2" } },
        { agent: "by-team", match: { channel: "slack", teamId: "T1" } },
        { agent: "by-guild", match: { channel: "discord", guildId: "g1" } },
        { agent: "by-guild-roles", match: { channel: "discord", guildId: "g1", roles: ["mod", "admin"] } },
        { agent: "by-peer-wildcard", match: { channel: "discord", peer: { kind: "group", id: "*" }, guildId: "g2" } },
        { agent: "by-peer", match: { channel: "discord", peer: { kind: "group", id: "room-7" } } },
        { agent: "by-peer-second", match: { channel: "discord", peer: { kind: "group", id: "room-7" } } },
      ],
    }),
  );
  const group = (c: MessageInitShape<typeof ChannelContextSchema>) =>
    ctx({ channel: "discord", chatType: ChatType.GROUP, ...c });
  const cases: [string, ReturnType<typeof ctx>, string, RouteTier][] = [
    [
      "exact peer (first in config order)",
      group({ peer: { id: "room-7" }, guildId: "g1", roles: ["mod"] }),
      "by-peer",
      RouteTier.PEER,
    ],
    [
      "a thread inherits its parent chat's peer binding",
      group({
        peer: { id: "thread-chat" },
        parentPeer: { id: "room-7" },
        threadId: "t9",
        guildId: "g1",
        roles: ["mod"],
      }),
      "by-peer",
      RouteTier.PARENT_PEER,
    ],
    [
      "peer wildcard (with its guild)",
      group({ peer: { id: "room-1" }, guildId: "g2" }),
      "by-peer-wildcard",
      RouteTier.PEER_WILDCARD,
    ],
    [
      "guild and one of the roles",
      group({ peer: { id: "room-1" }, guildId: "g1", roles: ["admin"] }),
      "by-guild-roles",
      RouteTier.GUILD_ROLES,
    ],
    [
      "guild, no listed role",
      group({ peer: { id: "room-1" }, guildId: "g1", roles: ["member"] }),
      "by-guild",
      RouteTier.GUILD,
    ],
    ["team", ctx({ channel: "slack", teamId: "T1" }), "by-team", RouteTier.TEAM],
    ["account", ctx({ channel: "discord", accountId: "bot2" }), "by-account", RouteTier.ACCOUNT],
    ["channel", ctx({ channel: "discord", accountId: "bot1" }), "by-channel", RouteTier.CHANNEL],
    ["default agent", ctx({ channel: "telegram" }), "fallback", RouteTier.DEFAULT],
    [
      "all fields must hold: a wildcard peer of another guild falls through",
      group({ peer: { id: "room-1" }, guildId: "g3" }),
      "by-channel",
      RouteTier.CHANNEL,
    ],
    [
      "a peer binding for groups does not catch a direct chat",
      ctx({ channel: "discord", peer: { id: "room-7" } }),
      "by-channel",
      RouteTier.CHANNEL,
    ],
  ];
  for (const [name, c, agent, tier] of cases) {
    test(name, () => {
      const route = router.resolve(c);
      assert.equal(route.agentId, agent);
      assert.equal(RouteTier[route.tier], RouteTier[tier]);
    });
  }

  test("candidates are worked out once per (channel, account), in an LRU of bounded size", () => {
    const small = new InboundRouter(config({ bindings: [{ agent: "a", match: { channel: "web" } }] }), 2);
    small.resolve(ctx({ channel: "web", accountId: "x" }));
    small.resolve(ctx({ channel: "web", accountId: "x", sender: { id: "u2" } }));
    assert.equal(small.cached, 1);
    small.resolve(ctx({ channel: "web", accountId: "y" }));
    small.resolve(ctx({ channel: "web", accountId: "z" }));
    assert.equal(small.cached, 2);
    assert.equal(
      small.resolve(ctx({ channel: "web", accountId: "x" })).agentId,
      "a",
      "an evicted pair is worked out again",
    );
  });
});

describe("session keys", () => {
  const dm = { channel: "telegram", accountId: "bot1", sender: { id: "42" }, peer: { id: "42" } };
  const keyFor = (dmScope: string, c = ctx(dm)) =>
    new InboundRouter(config({ session: { dmScope } })).resolve(c).sessionKey;

  test("direct messages are private by default: each sender of each channel alone", () => {
    const router = new InboundRouter(config({}));
    const of = (id: string, channel = "telegram") =>
      router.resolve(ctx({ channel, accountId: "bot1", sender: { id }, peer: { id } })).sessionKey;
    assert.equal(of("42"), "agent:main:telegram:dm:42");
    assert.notEqual(of("42"), of("43"));
    assert.notEqual(of("42"), of("42", "slack"));
  });

  test("each dm_scope", () => {
    assert.equal(keyFor("main"), "agent:main:main");
    assert.equal(keyFor("per-peer"), "agent:main:dm:42");
    assert.equal(keyFor("per-channel-peer"), "agent:main:telegram:dm:42");
    assert.equal(keyFor("per-account-channel-peer"), "agent:main:telegram:bot1:dm:42");
    // Only a direct message into the one shared session is marked shared (its own run answers it).
    const shared = (dmScope: string, c = ctx(dm)) =>
      new InboundRouter(config({ session: { dmScope } })).resolve(c).sharedDm;
    assert.equal(shared("main"), true);
    assert.equal(shared("per-channel-peer"), false);
    assert.equal(shared("main", ctx({ channel: "discord", chatType: ChatType.GROUP, peer: { id: "g" } })), false);
  });

  test("groups, channels and threads have keys of their own whatever the dm_scope", () => {
    const r = new InboundRouter(config({ session: { dmScope: "main" } }));
    assert.equal(
      r.resolve(ctx({ channel: "discord", chatType: ChatType.GROUP, peer: { id: "room-7" } })).sessionKey,
      "agent:main:discord:group:room-7",
    );
    assert.equal(
      r.resolve(ctx({ channel: "slack", chatType: ChatType.CHANNEL, peer: { id: "C01" } })).sessionKey,
      "agent:main:slack:channel:C01",
    );
    assert.equal(
      r.resolve(ctx({ channel: "slack", chatType: ChatType.CHANNEL, peer: { id: "C01" }, threadId: "1700.5" }))
        .sessionKey,
      "agent:main:slack:channel:C01:thread:1700.5",
    );
  });

  test("identity links make one person of ids on several channels: one session, one sender", () => {
    const r = new InboundRouter(
      config({ session: { dmScope: "per-peer", identityLinks: { alice: ["telegram:42", "discord:987"] } } }),
    );
    const onTelegram = r.resolve(ctx(dm));
    const onDiscord = r.resolve(ctx({ channel: "discord", sender: { id: "987" }, peer: { id: "987" } }));
    assert.equal(onTelegram.sessionKey, "agent:main:dm:alice");
    assert.equal(onDiscord.sessionKey, onTelegram.sessionKey);
    assert.equal(onTelegram.canonicalSender, "alice");
    assert.equal(onDiscord.canonicalSender, "alice");
    const stranger = r.resolve(ctx({ channel: "discord", sender: { id: "555" }, peer: { id: "555" } }));
    assert.equal(stranger.sessionKey, "agent:main:dm:555");
    assert.equal(stranger.canonicalSender, "discord:555");
  });

  test("a binding may set its own dm_scope; ids outside the session alphabet and long keys are hashed", () => {
    const r = new InboundRouter(
      config({
        session: { dmScope: "main" },
        bindings: [{ agent: "sales", match: { channel: "telegram", accountId: "bot1" }, dmScope: "per-peer" }],
      }),
    );
    assert.equal(r.resolve(ctx(dm)).sessionKey, "agent:sales:dm:42");
    const odd = r.resolve(
      ctx({ ...dm, sender: { id: "+1 (555) 010-9999" }, peer: { id: "+1 (555) 010-9999" } }),
    ).sessionKey;
    assert.match(odd, /^agent:sales:dm:x[0-9a-f]{16}$/);
    // A stranger who names themselves after that hash gets a session of their own, not that one.
    const spelled = odd.slice("agent:sales:dm:".length);
    const impostor = r.resolve(ctx({ ...dm, sender: { id: spelled }, peer: { id: spelled } })).sessionKey;
    assert.notEqual(impostor, odd);
    assert.match(impostor, /^agent:sales:dm:x[0-9a-f]{16}$/);
    const long = r.resolve(
      ctx({ channel: "discord", chatType: ChatType.GROUP, peer: { id: "r".repeat(64) }, threadId: "t".repeat(64) }),
    ).sessionKey;
    assert.ok(long.length <= 128);
    assert.match(long, /^agent:main:h:[0-9a-f]{32}$/);
  });
});

describe("configurations that make no sense are refused, with the place of the mistake", () => {
  const bad: [unknown, RegExp][] = [
    [{ session: { dmScope: "per-galaxy" } }, /session\.dmScope must be one of/],
    [{ defaultAgent: "Not An Id" }, /defaultAgent is not a valid agent id/],
    [{ bindings: [{ agent: "a", match: {} }] }, /bindings\[0\]\.match\.channel is required/],
    [
      { bindings: [{ agent: "a", match: { channel: "web", roles: ["x"] } }] },
      /bindings\[0\]\.match\.roles needs match\.guildId/,
    ],
    [
      { bindings: [{ agent: "a", match: { channel: "web", peer: { kind: "room", id: "1" } } }] },
      /bindings\[0\]\.match\.peer\.kind must be one of direct, group, channel/,
    ],
    [{ session: { identityLinks: { alice: ["42"] } } }, /identityLinks\.alice\[0\] must be "channel:id"/],
    [{ session: { identityLinks: { alice: ["web:1"], bob: ["web:1"] } } }, /repeats web:1, already linked to alice/],
  ];
  for (const [doc, message] of bad) test(JSON.stringify(doc), () => assert.throws(() => config(doc), message));
  test("not JSON", () => assert.throws(() => parseRouting("{", "routing.json"), /routing\.json: not JSON/));
});

describe("placement across runners (rendezvous hashing)", () => {
  test("a runner joining takes only its share; a runner leaving gives up only its own sessions", async () => {
    const { placeOn } = await import("../../services/router/server.js");
    const { RunnerDirectory } = await import("../../services/router/membership.js");
    const dir = new RunnerDirectory();
    const runner = (id: string) => ({ $typeName: "troupe.v1.RunnerInfo" as const, runnerId: id, address: `${id}:1` });
    for (const id of ["r1", "r2", "r3"]) dir.renew(runner(id), false);
    const keys = Array.from({ length: 3000 }, (_, i) => `agent:main:s${i}`);
    const before = new Map(keys.map((k) => [k, placeOn(dir.liveNow(), k)!.runnerId]));
    const share = (m: Map<string, string>, id: string) => [...m.values()].filter((v) => v === id).length;
    for (const id of ["r1", "r2", "r3"])
      assert.ok(Math.abs(share(before, id) - 1000) < 150, `${id} holds ${share(before, id)} of 3000`);

    dir.renew(runner("r4"), false);
    const joined = new Map(keys.map((k) => [k, placeOn(dir.liveNow(), k)!.runnerId]));
    const moved = keys.filter((k) => joined.get(k) !== before.get(k));
    assert.ok(
      moved.every((k) => joined.get(k) === "r4"),
      "sessions move only to the new runner",
    );
    assert.ok(Math.abs(moved.length - 750) < 150, `about a quarter moved (${moved.length})`);

    dir.renew(runner("r2"), true); // draining: no new placements
    const left = new Map(keys.map((k) => [k, placeOn(dir.liveNow(), k)!.runnerId]));
    const movedAgain = keys.filter((k) => left.get(k) !== joined.get(k));
    assert.ok(
      movedAgain.every((k) => joined.get(k) === "r2"),
      "only the leaving runner's sessions move",
    );
    assert.equal(movedAgain.length, share(joined, "r2"));
  });
});
