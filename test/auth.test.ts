// Authentication and ownership, end to end through the real processes: API keys at the gateway,
// sessions that answer only their owner, an internal token on every other service, and memory
// recalled under the session owner's scope.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { MemoryService } from "../services/shared/gen/troupe/v1/memory_pb.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../services/shared/gen/troupe/v1/runner_pb.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
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
  stack = await startStack({ services: ["model-server", "router", "memory", "sandbox", "runner", "gateway"], env: { TROUPE_SANDBOX_POOL: "0" } });
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
    const attempts: Record<string, string>[] = [{}, { authorization: "Bearer trp_not-a-key" }, { authorization: stack.apiKey }];
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
        ["deliver", anon.deliver({ message: { idempotencyKey: "k", context: { channel: "web", sender: { id: "1" } }, text: "hi" } })],
      ];
      for (const [name, call] of calls) await assert.rejects(call, { code: Status.UNAUTHENTICATED }, `${name} with ${JSON.stringify(headers)}`);
      const chat = await chatStatus(anon, "s", true);
      assert.equal(chat.code, Status.UNAUTHENTICATED);
      const sub = anon.subscribe({ sessionId: "s", afterSeq: 0n });
      const subStatus = await new Promise<grpc.StatusObject>((resolve) => sub.on("status", resolve).on("error", () => undefined).on("data", () => undefined));
      assert.equal(subStatus.code, Status.UNAUTHENTICATED);
      anon.close();
    }
    const health = createClient(Health, stack.addr.gateway);
    assert.equal((await health.check({ service: "" })).status, Serving.SERVING);
    health.close();
  });

  test("a session answers only the principal that opened it; others get PERMISSION_DENIED and leave no trace", async () => {
    const mine = await converse(alice, "alice-1", "hello from alice");
    mine.close();
    for (const [who, other] of [["bob-same-tenant", bob], ["mallory-other-tenant", mallory]] as const) {
      for (const create of [false, true]) assert.equal((await chatStatus(other, "alice-1", create)).code, Status.PERMISSION_DENIED, `${who} chat create=${create}`);
      await assert.rejects(other.sendMessage({ sessionId: "alice-1", frameId: `${who}-1`, text: "let me in" }), { code: Status.PERMISSION_DENIED });
      await assert.rejects(other.steer({ sessionId: "alice-1", frameId: `${who}-2`, text: "steer" }), { code: Status.PERMISSION_DENIED });
      await assert.rejects(other.followUp({ sessionId: "alice-1", frameId: `${who}-3`, text: "more" }), { code: Status.PERMISSION_DENIED });
      await assert.rejects(other.abort({ sessionId: "alice-1", frameId: `${who}-4` }), { code: Status.PERMISSION_DENIED });
      await assert.rejects(other.getHistory({ sessionId: "alice-1" }), { code: Status.PERMISSION_DENIED });
      await assert.rejects(other.createSession({ sessionId: "alice-1" }), { code: Status.PERMISSION_DENIED });
      await assert.rejects(subscribeUntil(other, "alice-1", 0n, 1), { code: Status.PERMISSION_DENIED });
      assert.deepEqual((await other.listSessions({})).sessions.map((s) => s.sessionId), [], `${who} lists none of alice's sessions`);
    }
    // Alice's session is as she left it: one prompt, one answer, nothing from the others.
    const history = await alice.getHistory({ sessionId: "alice-1" });
    assert.deepEqual(history.messages.map((m) => [m.role, m.text]), [
      [Role.USER, "hello from alice"],
      [Role.ASSISTANT, "You said: hello from alice"],
    ]);
    assert.deepEqual((await alice.listSessions({})).sessions.map((s) => s.sessionId), ["alice-1"]);
    // And she can still use it.
    (await converse(alice, "alice-1", "still mine")).close();
  });

  test("identity headers a client sends are ignored: the key alone says who it is", async () => {
    const forged = createClient(GatewayService, stack.addr.gateway, { headers: { "troupe-tenant": "acme", "troupe-principal": "alice", "troupe-internal-token": stack.internalHeaders["troupe-internal-token"] } });
    await assert.rejects(forged.getHistory({ sessionId: "alice-1" }), { code: Status.UNAUTHENTICATED });
    forged.close();
    // Bob's own key with alice's name in the headers still acts as bob.
    const bobKey = await addKey("acme", "bob2");
    const impostor = createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${bobKey}`, "troupe-tenant": "acme", "troupe-principal": "alice" } });
    await waitFor("the new key", async () => impostor.listSessions({}).then(() => true, (e: { code: number }) => e.code !== Status.UNAUTHENTICATED));
    await assert.rejects(impostor.getHistory({ sessionId: "alice-1" }), { code: Status.PERMISSION_DENIED });
    impostor.close();
  });

  test("a key removed from the keys file stops working without a restart", async () => {
    const key = await addKey("acme", "temp");
    const temp = createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${key}` } });
    await waitFor("the new key", async () => temp.listSessions({}).then(() => true, () => false));
    const file = path.join(stack.dataDir, "auth", "api-keys.json");
    const doc = JSON.parse(await readFile(file, "utf8")) as { keys: { principal: string }[] };
    await writeFile(file, JSON.stringify({ keys: doc.keys.filter((k) => k.principal !== "temp") }));
    await waitFor("the key to be revoked", async () => temp.listSessions({}).then(() => false, (e: { code: number }) => e.code === Status.UNAUTHENTICATED));
    // Everyone else is unaffected.
    await alice.listSessions({});
    temp.close();
  });
});

async function addKey(tenant: string, principal: string): Promise<string> {
  const { createApiKey } = await import("../services/shared/auth.js");
  return createApiKey(path.join(stack.dataDir, "auth", "api-keys.json"), tenant, principal, principal);
}

describe("Troupe's internal services", () => {
  test("refuse calls without the internal token, or with a wrong one; answer Troupe's own", async () => {
    const probes = [
      { name: "router", call: (h: Record<string, string>) => createClient(RouterService, stack.addr.router, { headers: h }).listRunners({}) },
      { name: "runner", call: (h: Record<string, string>) => createClient(RunnerService, stack.addr.runner, { headers: h }).getRunnerStats({}) },
      { name: "sandbox", call: (h: Record<string, string>) => createClient(SandboxService, stack.addr.sandbox, { headers: h }).listSandboxes({}) },
      { name: "memory", call: (h: Record<string, string>) => createClient(MemoryService, stack.addr.memory, { headers: h }).searchMemories({ scope: { tenant: "acme", owner: "alice" }, query: "x" }) },
    ];
    for (const p of probes) {
      await assert.rejects(p.call({}), { code: Status.UNAUTHENTICATED }, `${p.name} without a token`);
      await assert.rejects(p.call({ "troupe-internal-token": "wrong" }), { code: Status.UNAUTHENTICATED }, `${p.name} with a wrong token`);
      // A client's API key is not the internal token.
      await assert.rejects(p.call({ authorization: `Bearer ${stack.apiKey}` }), { code: Status.UNAUTHENTICATED }, `${p.name} with an API key`);
      await p.call(stack.internalHeaders);
    }
  });

  test("the runner serves a session only on behalf of its owner, even to internal callers", async () => {
    const asBob = stack.client(RunnerService, stack.addr.runner, { as: { tenant: "acme", principal: "bob" } });
    await assert.rejects(asBob.readHistory({ sessionId: "alice-1" }), { code: Status.PERMISSION_DENIED });
    const anonymous = stack.client(RunnerService, stack.addr.runner);
    await assert.rejects(anonymous.readHistory({ sessionId: "alice-1" }), { code: Status.UNAUTHENTICATED });
    const asAlice = stack.client(RunnerService, stack.addr.runner, { as: { tenant: "acme", principal: "alice" } });
    assert.ok((await asAlice.readHistory({ sessionId: "alice-1" })).messages.length >= 2);
    for (const c of [asBob, anonymous, asAlice]) c.close();
  });
});

describe("memory follows the session's owner", () => {
  test("a run recalls its owner's memories, never another principal's", async () => {
    // A principal whose scope no earlier run searched: the runner believes a scope found empty
    // for 5 s, and this memory is saved past the runner, so alice's earlier runs would race it.
    const carol = await stack.gatewayAs("acme", "carol");
    const memory = stack.client(MemoryService, stack.addr.memory);
    await memory.addMemories({ scope: { tenant: "acme", owner: "carol", agentId: "main" }, memories: [{ text: "Alice keeps bees on the roof of the office" }] });
    memory.close();
    const a = await converse(carol, "carol-mem", "!system where does Alice keep bees");
    const b = await converse(bob, "bob-mem", "!system where does Alice keep bees");
    const said = (s: ChatSession) => s.events.flatMap((e) => (e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT ? [e.payload.value.message.text] : [])).join(" ");
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
    const { ensureDevKey, ApiKeys } = await import("../services/shared/auth.js");
    const dataDir = await tempDir(t, "troupe-devkey-");
    const keysDir = await tempDir(t, "troupe-keys-");
    const keysFile = path.join(keysDir, "keys.json");
    const dev = await ensureDevKey(dataDir, keysFile);
    assert.equal(dev.created, true);
    assert.equal((await statFile(path.join(dataDir, "auth", "dev-key"))).mode & 0o077, 0);
    assert.deepEqual((await ApiKeys.load(keysFile)).verify(dev.key), { tenant: "local", principal: "dev" });
    assert.deepEqual(await ensureDevKey(dataDir, keysFile), { key: dev.key, created: false });
  });
});
