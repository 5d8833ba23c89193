// Authentication and ownership, end to end through the real processes: API keys at the gateway,
// sessions that answer only their owner, an internal token on every other service, and memory
// recalled under the session owner's scope.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import type * as grpc from "@grpc/grpc-js";
import {
  Health,
  HealthCheckResponse_ServingStatus as Serving,
} from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { MemoryService } from "../services/shared/gen/troupe/v1/memory_pb.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../services/shared/gen/troupe/v1/runner_pb.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ApiKeys, createApiKey, revokeApiKey } from "../services/shared/auth/api-keys.js";
import { Status } from "../services/shared/errors.js";
import { createClient, type ServiceClient } from "../services/shared/rpc.js";
import { ChatSession, subscribeUntil } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";
import { tempDir } from "./helpers/tempdir.js";

type Gateway = ServiceClient<(typeof GatewayService)["method"]>;

let stack: Stack;
let alice: Gateway;
let bob: Gateway;
let mallory: Gateway;

before(async () => {
  stack = await startStack({
    services: ["model-server", "router", "memory", "sandbox", "runner", "gateway"],
    env: { TROUPE_SANDBOX_POOL: "0" },
  });
  alice = await stack.gatewayAs("acme", "alice");
  bob = await stack.gatewayAs("acme", "bob");
  mallory = await stack.gatewayAs("evil", "mallory");
});
after(async () => {
  for (const c of [alice, bob, mallory]) c?.close();
  await stack?.stop();
});

/** Opens (creating) a session as `client` and runs one turn; resolves once it ended. */
async function converse(client: Gateway, sessionId: string, text: string): Promise<ChatSession> {
  const s = new ChatSession(client);
  s.send({ case: "open", value: { sessionId, create: true } });
  await s.waitOpened();
  s.prompt(text);
  await s.waitForPayload("agentEnd", 20_000);
  return s;
}

async function chatStatus(client: Gateway, sessionId: string, create: boolean): Promise<grpc.StatusObject> {
  const s = new ChatSession(client);
  s.send({ case: "open", value: { sessionId, create } });
  return s.ended();
}

describe("clients at the gateway", () => {
  test("every public call without a key, or with an unknown one, is UNAUTHENTICATED; health answers anyone", async () => {
    const attempts: Record<string, string>[] = [
      {},
      { authorization: "Bearer trp_not-a-key" },
      { authorization: stack.apiKey },
    ];
    for (const headers of attempts) {
      const anon = createClient(GatewayService, stack.addr.gateway, { headers });
      const calls: [string, Promise<unknown>][] = [
        ["createSession", anon.createSession({})],
        ["sendMessage", anon.sendMessage({ sessionId: "s", frameId: "f", text: "hi" })],
        ["steer", anon.steer({ sessionId: "s", frameId: "f", text: "hi" })],
        ["followUp", anon.followUp({ sessionId: "s", frameId: "f", text: "hi" })],
        ["abort", anon.abort({ sessionId: "s", frameId: "f" })],
        ["getHistory", anon.getHistory({ sessionId: "s" })],
        ["listSessions", anon.listSessions({})],
        [
          "deliver",
          anon.deliver({
            message: { idempotencyKey: "k", context: { channel: "web", sender: { id: "1" } }, text: "hi" },
          }),
        ],
      ];
      for (const [name, call] of calls)
        await assert.rejects(call, { code: Status.UNAUTHENTICATED }, `${name} with ${JSON.stringify(headers)}`);
      const chat = await chatStatus(anon, "s", true);
      assert.equal(chat.code, Status.UNAUTHENTICATED);
      const sub = anon.subscribe({ sessionId: "s", afterSeq: 0n });
      const subStatus = await new Promise<grpc.StatusObject>((resolve) =>
        sub
          .on("status", resolve)
          .on("error", () => undefined)
          .on("data", () => undefined),
      );
      assert.equal(subStatus.code, Status.UNAUTHENTICATED);
      anon.close();
    }
    const health = createClient(Health, stack.addr.gateway);
    assert.equal((await health.check({ service: "" })).status, Serving.SERVING);
    health.close();
  });

  test("another principal's session does not exist for a caller: NOT_FOUND as for a missing one, by the same path", async () => {
    const mine = await converse(alice, "alice-1", "hello from alice");
    mine.close();
    const missing = (err: unknown, id: string) => {
      const e = err as { code: number; details: string };
      assert.equal(e.code, Status.NOT_FOUND, e.details);
      assert.match(e.details, new RegExp(`session ${id} does not exist`));
      return true;
    };
    for (const [who, other] of [
      ["bob-same-tenant", bob],
      ["mallory-other-tenant", mallory],
    ] as const) {
      for (const id of ["alice-1", `never-${who}`]) {
        const chat = await chatStatus(other, id, false);
        assert.equal(chat.code, Status.NOT_FOUND, `${who} chat ${id}: ${chat.details}`);
        await assert.rejects(other.sendMessage({ sessionId: id, frameId: `${who}-1`, text: "let me in" }), (e) =>
          missing(e, id),
        );
        await assert.rejects(other.steer({ sessionId: id, frameId: `${who}-2`, text: "steer" }), (e) => missing(e, id));
        await assert.rejects(other.followUp({ sessionId: id, frameId: `${who}-3`, text: "more" }), (e) =>
          missing(e, id),
        );
        await assert.rejects(other.abort({ sessionId: id, frameId: `${who}-4` }), (e) => missing(e, id));
        await assert.rejects(other.getHistory({ sessionId: id }), (e) => missing(e, id));
        await assert.rejects(other.listSchedules({ sessionId: id }), (e) => missing(e, id));
        await assert.rejects(subscribeUntil(other, id, 0n, 1), { code: Status.NOT_FOUND });
      }
      assert.deepEqual(
        (await other.listSessions({})).sessions.map((s) => s.sessionId),
        [],
        `${who} lists none of alice's sessions`,
      );
    }
    // The same timing as a missing session, to within noise: both look up a log the caller does not have.
    const median = async (id: string) => {
      const times: number[] = [];
      for (let i = 0; i < 40; i++) {
        const t0 = performance.now();
        await bob.getHistory({ sessionId: id }).catch(() => undefined);
        times.push(performance.now() - t0);
      }
      return times.sort((a, b) => a - b)[20];
    };
    const [foreign, absent] = [await median("alice-1"), await median("never-there")];
    assert.ok(
      foreign < absent * 3 + 1 && absent < foreign * 3 + 1,
      `foreign ${foreign.toFixed(2)} ms, missing ${absent.toFixed(2)} ms`,
    );

    // The same id is free for each owner: bob's "alice-1" is a new session of his, not alice's.
    const bobs = await bob.createSession({ sessionId: "alice-1" });
    assert.equal(bobs.session?.sessionId, "alice-1");
    assert.deepEqual((await bob.getHistory({ sessionId: "alice-1" })).messages, []);
    (await converse(mallory, "alice-1", "mallory's own")).close();
    // Alice's session is as she left it: one prompt, one answer, nothing from the others.
    const history = await alice.getHistory({ sessionId: "alice-1" });
    assert.deepEqual(
      history.messages.map((m) => [m.role, m.text]),
      [
        [Role.USER, "hello from alice"],
        [Role.ASSISTANT, "You said: hello from alice"],
      ],
    );
    assert.deepEqual(
      (await alice.listSessions({})).sessions.map((s) => s.sessionId),
      ["alice-1"],
    );
    assert.deepEqual(
      (await mallory.getHistory({ sessionId: "alice-1" })).messages.map((m) => m.text),
      ["mallory's own", "You said: mallory's own"],
    );
    // And she can still use it.
    (await converse(alice, "alice-1", "still mine")).close();
  });

  test("schedules of look-alike session ids stay apart: no listing, deleting or firing across owners", async () => {
    // Tenant evil's "agent_x_main" once shared a schedule file with acme's "agent:x:main".
    (await converse(alice, "agent:x:main", "hi")).close();
    await alice.createSchedule({
      schedule: {
        sessionId: "agent:x:main",
        scheduleId: "secret",
        when: { case: "cron", value: "0 3 * * *" },
        text: "alice's private reminder",
      },
    });
    (await converse(mallory, "agent_x_main", "hi")).close();
    assert.deepEqual((await mallory.listSchedules({ sessionId: "agent_x_main" })).schedules, []);
    assert.equal((await mallory.deleteSchedule({ sessionId: "agent_x_main", scheduleId: "secret" })).deleted, false);
    await mallory.createSchedule({
      schedule: {
        sessionId: "agent_x_main",
        scheduleId: "tick",
        when: { case: "everySeconds", value: 10 },
        text: "mallory speaking",
      },
    });
    assert.deepEqual(
      (await alice.listSchedules({ sessionId: "agent:x:main" })).schedules.map((x) => [x.scheduleId, x.text]),
      [["secret", "alice's private reminder"]],
    );
    assert.deepEqual(
      (await mallory.listSchedules({ sessionId: "agent_x_main" })).schedules.map((x) => x.scheduleId),
      ["tick"],
    );
    // Mallory's heartbeat fires into her own session, never into alice's.
    await waitFor(
      "mallory's heartbeat to fire",
      async () =>
        (await mallory.getHistory({ sessionId: "agent_x_main" })).messages.some((m) =>
          m.text.includes("mallory speaking"),
        ),
      30_000,
      500,
    );
    assert.ok(
      !(await alice.getHistory({ sessionId: "agent:x:main" })).messages.some((m) =>
        m.text.includes("mallory speaking"),
      ),
    );
    await mallory.deleteSchedule({ sessionId: "agent_x_main", scheduleId: "tick" });
  });

  test("identity headers a client sends are ignored: the key alone says who it is", async () => {
    const forged = createClient(GatewayService, stack.addr.gateway, {
      headers: {
        "troupe-tenant": "acme",
        "troupe-principal": "alice",
        "troupe-internal-token": stack.internalHeaders["troupe-internal-token"],
      },
    });
    await assert.rejects(forged.getHistory({ sessionId: "alice-1" }), { code: Status.UNAUTHENTICATED });
    forged.close();
    // Bob's own key with alice's name in the headers still acts as bob.
    const bobKey = await addKey("acme", "bob2");
    const impostor = createClient(GatewayService, stack.addr.gateway, {
      headers: { authorization: `Bearer ${bobKey}`, "troupe-tenant": "acme", "troupe-principal": "alice" },
    });
    await waitFor("the new key", async () =>
      impostor.listSessions({}).then(
        () => true,
        (e: { code: number }) => e.code !== Status.UNAUTHENTICATED,
      ),
    );
    await assert.rejects(impostor.getHistory({ sessionId: "alice-1" }), { code: Status.NOT_FOUND });
    impostor.close();
  });

  test("a key removed from the keys file stops working without a restart", async () => {
    const key = await addKey("acme", "temp");
    const temp = createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${key}` } });
    await waitFor("the new key", async () =>
      temp.listSessions({}).then(
        () => true,
        () => false,
      ),
    );
    const file = path.join(stack.dataDir, "auth", "api-keys.json");
    const doc = JSON.parse(await readFile(file, "utf8")) as { keys: { principal: string }[] };
    await writeFile(file, JSON.stringify({ keys: doc.keys.filter((k) => k.principal !== "temp") }));
    await waitFor("the key to be revoked", async () =>
      temp.listSessions({}).then(
        () => false,
        (e: { code: number }) => e.code === Status.UNAUTHENTICATED,
      ),
    );
    // Everyone else is unaffected.
    await alice.listSessions({});
    temp.close();
  });

  test("revoking a key ends its open Chat and Subscribe streams within seconds", async () => {
    const key = await addKey("acme", "streamer");
    const client = createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${key}` } });
    await waitFor("the new key", async () =>
      client.listSessions({}).then(
        () => true,
        () => false,
      ),
    );
    const chat = new ChatSession(client);
    chat.send({ case: "open", value: { sessionId: "held-open", create: true } });
    await chat.waitOpened();
    const sub = client.subscribe({ sessionId: "held-open", afterSeq: 0n });
    const subEnded = new Promise<grpc.StatusObject>((resolve) =>
      sub
        .on("status", resolve)
        .on("error", () => undefined)
        .on("data", () => undefined),
    );
    const t0 = Date.now();
    assert.equal(await revokeApiKey(path.join(stack.dataDir, "auth", "api-keys.json"), "streamer"), true);
    const [chatStatus, subStatus] = await Promise.all([chat.ended(), subEnded]);
    assert.equal(chatStatus.code, Status.UNAUTHENTICATED, chatStatus.details);
    assert.match(chatStatus.details, /revoked/);
    assert.equal(subStatus.code, Status.UNAUTHENTICATED, subStatus.details);
    assert.ok(Date.now() - t0 < 8000, `ended after ${Date.now() - t0} ms`);
    client.close();
  });

  test("a keys file broken in the same edit that removes a key keeps no removed key", async () => {
    const kept = await addKey("acme", "kept");
    const dropped = await addKey("acme", "dropped");
    const keptClient = createClient(GatewayService, stack.addr.gateway, {
      headers: { authorization: `Bearer ${kept}` },
    });
    const droppedClient = createClient(GatewayService, stack.addr.gateway, {
      headers: { authorization: `Bearer ${dropped}` },
    });
    await waitFor("both keys", async () =>
      (
        await Promise.all(
          [keptClient, droppedClient].map((c) =>
            c.listSessions({}).then(
              () => true,
              () => false,
            ),
          ),
        )
      ).every(Boolean),
    );
    const file = path.join(stack.dataDir, "auth", "api-keys.json");
    const good = await readFile(file, "utf8");
    const doc = JSON.parse(good) as { keys: { id: string }[] };
    // A hand edit: the key's entry deleted, and a trailing comma that makes the file invalid JSON.
    await writeFile(
      file,
      JSON.stringify({ keys: doc.keys.filter((k) => k.id !== "dropped") }, null, 2).replace(/}\n {2}\]/, "},\n  ]"),
    );
    await waitFor("the removed key to be refused", async () =>
      droppedClient.listSessions({}).then(
        () => false,
        (e: { code: number }) => e.code === Status.UNAUTHENTICATED,
      ),
    );
    await keptClient.listSessions({});
    await alice.listSessions({});
    await writeFile(file, JSON.stringify({ keys: doc.keys.filter((k) => k.id !== "dropped") }, null, 2));
    for (const c of [keptClient, droppedClient]) c.close();
  });
});

async function addKey(tenant: string, principal: string): Promise<string> {
  return createApiKey(path.join(stack.dataDir, "auth", "api-keys.json"), { tenant, principal, id: principal });
}

describe("Troupe's internal services", () => {
  test("refuse calls without the internal token, or with a wrong one; answer Troupe's own", async () => {
    const probes = [
      {
        name: "router",
        call: (h: Record<string, string>) =>
          createClient(RouterService, stack.addr.router, { headers: h }).listRunners({}),
      },
      {
        name: "runner",
        call: (h: Record<string, string>) =>
          createClient(RunnerService, stack.addr.runner, { headers: h }).getRunnerStats({}),
      },
      {
        name: "sandbox",
        call: (h: Record<string, string>) =>
          createClient(SandboxService, stack.addr.sandbox, { headers: h }).listSandboxes({}),
      },
      {
        name: "memory",
        call: (h: Record<string, string>) =>
          createClient(MemoryService, stack.addr.memory, { headers: h }).searchMemories({
            scope: { tenant: "acme", owner: "alice" },
            query: "x",
          }),
      },
    ];
    for (const p of probes) {
      await assert.rejects(p.call({}), { code: Status.UNAUTHENTICATED }, `${p.name} without a token`);
      await assert.rejects(
        p.call({ "troupe-internal-token": "wrong" }),
        { code: Status.UNAUTHENTICATED },
        `${p.name} with a wrong token`,
      );
      // A client's API key is not the internal token.
      await assert.rejects(
        p.call({ authorization: `Bearer ${stack.apiKey}` }),
        { code: Status.UNAUTHENTICATED },
        `${p.name} with an API key`,
      );
      await p.call(stack.internalHeaders);
    }
  });

  test("the runner serves a session only on behalf of its owner, even to internal callers", async () => {
    const asCarol = stack.client(RunnerService, stack.addr.runner, { as: { tenant: "acme", principal: "carol" } });
    await assert.rejects(asCarol.readHistory({ sessionId: "alice-1" }), { code: Status.NOT_FOUND });
    const anonymous = stack.client(RunnerService, stack.addr.runner);
    await assert.rejects(anonymous.readHistory({ sessionId: "alice-1" }), { code: Status.UNAUTHENTICATED });
    const asAlice = stack.client(RunnerService, stack.addr.runner, { as: { tenant: "acme", principal: "alice" } });
    assert.ok((await asAlice.readHistory({ sessionId: "alice-1" })).messages.length >= 2);
    for (const c of [asCarol, anonymous, asAlice]) c.close();
  });

  test("the runner checks what an internal caller opens as it checks a client's open frame", async () => {
    const asAlice = stack.client(RunnerService, stack.addr.runner, { as: { tenant: "acme", principal: "alice" } });
    try {
      for (const [open, why] of [
        [{ sessionId: "alice-effort", create: true, reasoningEffort: "extreme" }, /reasoning_effort/],
        [{ sessionId: "../alice", create: true }, /session_id/],
        [{ sessionId: "alice-model", create: true, model: "bad model!" }, /model/],
      ] as const)
        await assert.rejects(asAlice.ensureSession({ open }), (err: { code: number; details: string }) => {
          assert.equal(err.code, Status.INVALID_ARGUMENT);
          assert.match(err.details, why);
          return true;
        });
    } finally {
      asAlice.close();
    }
  });
});

describe("memory follows the session's owner", () => {
  test("a run recalls its owner's memories, never another principal's", async () => {
    // A principal whose scope no earlier run searched: the runner believes a scope found empty
    // for 5 s, and this memory is saved past the runner, so alice's earlier runs would race it.
    const carol = await stack.gatewayAs("acme", "carol");
    const memory = stack.client(MemoryService, stack.addr.memory);
    await memory.addMemories({
      scope: { tenant: "acme", owner: "carol", agentId: "main" },
      memories: [{ text: "Alice keeps bees on the roof of the office" }],
    });
    memory.close();
    const a = await converse(carol, "carol-mem", "!system where does Alice keep bees");
    const b = await converse(bob, "bob-mem", "!system where does Alice keep bees");
    const said = (s: ChatSession) =>
      s.events
        .flatMap((e) =>
          e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT
            ? [e.payload.value.message.text]
            : [],
        )
        .join(" ");
    assert.match(said(a), /Alice keeps bees on the roof/);
    assert.doesNotMatch(said(b), /bees/);
    a.close();
    b.close();
    carol.close();
  });
});

describe("the development key", () => {
  test("is made even when the keys file lives outside the data directory (--api-keys)", async (t) => {
    const { stat: statFile } = await import("node:fs/promises");
    const { ensureDevKey } = await import("../services/shared/auth/auth.js");
    const dataDir = await tempDir(t, "troupe-devkey-");
    const keysDir = await tempDir(t, "troupe-keys-");
    const keysFile = path.join(keysDir, "keys.json");
    const dev = await ensureDevKey(dataDir, keysFile);
    assert.equal(dev.created, true);
    assert.equal((await statFile(path.join(dataDir, "auth", "dev-key"))).mode & 0o077, 0);
    const verified = (await ApiKeys.load(keysFile)).verify(dev.key);
    assert.deepEqual(verified && { tenant: verified.tenant, principal: verified.principal, role: verified.role }, {
      tenant: "local",
      principal: "dev",
      role: "user",
    });
    assert.deepEqual(await ensureDevKey(dataDir, keysFile), { key: dev.key, created: false });
  });
});
