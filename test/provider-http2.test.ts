// Providers reached over HTTPS that offer h2 by ALPN, as hosted APIs are: undici, the runner's
// HTTP client, then speaks HTTP/2, and the replies from one provider share a few connections. The
// provider conformance servers elsewhere speak plain HTTP/1.1, so this is where the HTTP/2 path
// runs, for the three chat kinds. What the other side may do is RFC 9113's: a GOAWAY closes a
// connection gracefully, the streams it names still answered in full (section 6.8), and any sent
// after them refused unprocessed, which a client may send again (section 8.7); SETTINGS may allow
// fewer streams than the client would use; a connection can also just end, streams and all.
// Real processes; the providers are helpers/openai-api.ts, responses-api.ts and anthropic-api.ts.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { caAndServer } from "./helpers/certs.js";
import { AnthropicApiServer } from "./helpers/anthropic-api.js";
import type { ApiServer } from "./helpers/api-server.js";
import { ChatApiServer, type ChatBody } from "./helpers/openai-api.js";
import { ResponsesApiServer } from "./helpers/responses-api.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, writeAgent, type Stack } from "./helpers/stack.js";
import { endOf, of, replyOf } from "./helpers/turn-stack.js";

const KEY = "sk-e2e-http2";
const WORDS = Array.from({ length: 12 }, (_, i) => `w${i + 1}`).join(" ");
const system = (b: ChatBody) => String(b.messages[0]?.content ?? "");
const lastUser = (b: ChatBody) => String(b.messages.findLast((m) => m.role === "user")?.content ?? "");

/** A tool call when asked to remember, the tool's answer acknowledged, otherwise the prompt's words. */
function reply(body: ChatBody) {
  if (system(body).startsWith("[troupe:")) return { text: '{"facts": [], "event": "NONE"}' };
  if (body.messages.some((m) => m.role === "tool")) return { text: "saved it" };
  if (lastUser(body).startsWith("remember"))
    return { toolCalls: [{ name: "memory_save", arguments: { text: "bees" } }] };
  return { text: WORDS };
}

let provider: ChatApiServer;
/** Allows 4 streams per connection, as some edges allow fewer than undici's 100. */
let narrow: ChatApiServer;
let responses: ResponsesApiServer;
let anthropic: AnthropicApiServer;
let stack: Stack;
let dir: string;

async function open(agentId = "main"): Promise<ChatSession> {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { agentId, create: true } });
  await s.waitOpened();
  return s;
}

/** The text deltas a session has had so far. */
const deltas = (s: ChatSession) => of(s.events, "messageUpdate").filter((u) => u.delta.case === "text").length;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "troupe-http2-"));
  caAndServer(dir, "provider");
  const tls = {
    cert: await readFile(path.join(dir, "provider.pem")),
    key: await readFile(path.join(dir, "provider.key")),
  };
  provider = await new ChatApiServer({ flavour: "openai", apiKey: KEY, reply }).start("127.0.0.1", tls);
  narrow = await new ChatApiServer({ flavour: "openai", apiKey: KEY, reply }).start("127.0.0.1", {
    ...tls,
    maxConcurrentStreams: 4,
  });
  responses = await new ResponsesApiServer({
    apiKey: KEY,
    reply: (b) =>
      b.input.some((i) => i.type === "function_call_output")
        ? { text: "noted through the Responses API" }
        : { calls: [{ name: "memory_save", arguments: { text: "bees" } }] },
  }).start("127.0.0.1", tls);
  anthropic = await new AnthropicApiServer({
    apiKey: KEY,
    reply: (b) =>
      JSON.stringify(b.messages).includes('"tool_result"')
        ? { text: "noted through the Messages API" }
        : { calls: [{ name: "memory_save", input: { text: "bees" } }] },
  }).start("127.0.0.1", tls);
  const key = { env: "TROUPE_TEST_PROVIDER_KEY" };
  const providersFile = path.join(dir, "providers.json");
  await writeFile(
    providersFile,
    JSON.stringify({
      providers: {
        hosted: { kind: "openai", baseUrl: provider.baseUrl, apiKey: key },
        narrow: { kind: "openai", baseUrl: narrow.baseUrl, apiKey: key },
        responses: { kind: "openai-responses", baseUrl: responses.baseUrl, apiKey: key },
        claude: { kind: "anthropic", baseUrl: anthropic.baseUrl, apiKey: key },
      },
      default: "hosted",
    }),
  );
  const agent = (id: string, config: object) => writeAgent(dir, id, config);
  // One attempt per call: a cut reply must show as the turn's error, not be hidden by a retry.
  await agent("main", { model: "hosted/gpt-4.1-mini", retry: { maxRetries: 0 } });
  await agent("narrow", { model: "narrow/gpt-4.1-mini" });
  await agent("reasoner", { model: "responses/gpt-5-mini", reasoningEffort: "medium" });
  await agent("claude", { model: "claude/claude-sonnet-4-6", reasoningEffort: "low" });
  stack = await startStack({
    dataDir: dir,
    env: {
      TROUPE_PROVIDERS_FILE: providersFile,
      TROUPE_TEST_PROVIDER_KEY: KEY,
      TROUPE_MODEL: "hosted/gpt-4.1-mini",
      // The provider's certificate is signed by a CA the runner is told to trust, as an operator
      // behind a TLS-inspecting proxy would tell it.
      NODE_EXTRA_CA_CERTS: path.join(dir, "provider-ca.pem"),
    },
  });
});
after(async () => {
  await stack?.stop();
  await Promise.all([provider?.close(), narrow?.close(), responses?.close(), anthropic?.close()]);
  await rm(dir, { recursive: true, force: true });
});

describe("a provider that speaks HTTP/2", () => {
  test("a turn with a tool call completes, every request over HTTP/2 and accepted", async () => {
    const s = await open();
    const events = await s.turn("remember that I keep bees", 30_000);
    s.close();
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED, JSON.stringify(of(events, "error")));
    assert.equal(of(events, "toolExecutionEnd")[0]?.isError, false);
    assert.equal(replyOf(events), "saved it");
    assert.deepEqual(provider.refused, []);
    assert.ok(provider.httpVersions.length >= 2);
    assert.deepEqual(new Set(provider.httpVersions), new Set(["2.0"]));
  });

  for (const [kind, agentId, server, answer] of [
    ["Responses API", "reasoner", () => responses, "noted through the Responses API"],
    ["Anthropic Messages API", "claude", () => anthropic, "noted through the Messages API"],
  ] as const) {
    test(`the ${kind}: a turn with a tool call completes over HTTP/2, every request accepted`, async () => {
      const api: ApiServer = server();
      const s = await open(agentId);
      const events = await s.turn("remember that I keep bees", 30_000);
      s.close();
      assert.equal(endOf(events).stopReason, StopReason.COMPLETED, JSON.stringify(of(events, "error")));
      assert.equal(replyOf(events), answer);
      assert.deepEqual(api.refused, []);
      assert.ok(api.httpVersions.length >= 2);
      assert.deepEqual(new Set(api.httpVersions), new Set(["2.0"]));
    });
  }

  test("ten sessions streaming at once share one connection", async () => {
    provider.eventGapMs = 100; // each reply lasts over a second: all ten overlap
    const sessions = await Promise.all(Array.from({ length: 10 }, open));
    const turns = await Promise.all(sessions.map((s) => s.turn("say your words", 30_000)));
    for (const s of sessions) s.close();
    for (const events of turns) assert.equal(replyOf(events), WORDS);
    assert.ok(provider.streamsAtOnce >= 10, `at most ${provider.streamsAtOnce} replies on one connection at once`);
  });

  test("a provider allowing 4 streams a connection: ten sessions stream at once on more connections", async () => {
    narrow.eventGapMs = 100;
    const sessions = await Promise.all(Array.from({ length: 10 }, () => open("narrow")));
    const firsts: number[] = [];
    const turns = await Promise.all(
      sessions.map(async (s) => {
        const from = s.events.length;
        s.prompt("say your words");
        await s.until(() => deltas(s) >= 1, 20_000);
        firsts.push(Date.now());
        await s.waitForPayload("agentEnd", 30_000, from);
        return { events: s.events.slice(from), ended: Date.now() };
      }),
    );
    for (const s of sessions) s.close();
    for (const t of turns) assert.equal(replyOf(t.events), WORDS);
    // None waited for another's reply to end: the pool opened connections past the server's limit.
    assert.ok(Math.max(...firsts) < Math.min(...turns.map((t) => t.ended)), "every reply began before the first ended");
    assert.ok(narrow.streamsAtOnce <= 4, `${narrow.streamsAtOnce} streams on one connection`);
    assert.ok(narrow.connections >= 3, `${narrow.connections} connections`);
  });

  test("a GOAWAY mid-reply: the reply completes, the next turn opens a new connection", async () => {
    provider.eventGapMs = 60;
    const before = provider.connections;
    const s = await open();
    s.prompt("say your words");
    await s.until(() => deltas(s) >= 2, 20_000);
    provider.goAway();
    await s.waitForPayload("agentEnd", 20_000);
    assert.equal(endOf(s.events).stopReason, StopReason.COMPLETED);
    assert.equal(replyOf(s.events), WORDS);
    const next = await s.turn("say your words again", 30_000);
    s.close();
    assert.equal(replyOf(next), WORDS);
    assert.equal(provider.connections - before, 1, "one new connection, after the GOAWAY");
  });

  test("a GOAWAY refusing replies the provider never began: they are sent again, every one completes", async () => {
    provider.eventGapMs = 100;
    const sessions = await Promise.all(Array.from({ length: 10 }, () => open()));
    const before = { connections: provider.connections, requests: provider.httpVersions.length };
    provider.goAwayAtRequest = 6;
    const turns = await Promise.all(sessions.map((s) => s.turn("say your words", 30_000)));
    for (const s of sessions) s.close();
    assert.equal(provider.goAwayAtRequest, undefined, "the GOAWAY went");
    // The agent allows no retry: a refused request surfacing as an error would end its turn so
    // (undici 8.5 failed them so: nodejs/undici#5468).
    for (const events of turns) {
      assert.deepEqual(of(events, "error"), []);
      assert.equal(replyOf(events), WORDS);
    }
    assert.ok(provider.httpVersions.length - before.requests >= 15, "five requests came twice");
    assert.ok(provider.connections > before.connections, "the refused ones on a new connection");
  });

  test("a connection cut mid-reply: the turn ends in a retryable model error, the next completes", async () => {
    provider.eventGapMs = 60;
    const s = await open();
    const from = s.events.length;
    s.prompt("say your words");
    await s.until(() => deltas(s) >= 2, 20_000);
    provider.cutConnections();
    await s.waitForPayload("agentEnd", 20_000, from);
    const events = s.events.slice(from);
    const [error] = of(events, "error");
    assert.equal(error?.code, "MODEL_ERROR");
    assert.equal(error?.retryable, true);
    assert.match(error?.message ?? "", /unreachable|closed|terminated|reset/i);
    // What arrived before the cut is kept in the conversation; nothing is made up after it.
    const text = replyOf(events);
    assert.ok(text.length > 0 && WORDS.startsWith(text), text);
    const next = await s.turn("say your words again", 30_000);
    s.close();
    assert.equal(endOf(next).stopReason, StopReason.COMPLETED);
    assert.equal(replyOf(next), WORDS);
  });

  test("an abort mid-reply resets its own stream; another session's reply goes on", async () => {
    provider.eventGapMs = 60;
    const [a, b] = await Promise.all([open(), open()]);
    const before = { connections: provider.connections, unfinished: provider.unfinished };
    a.prompt("say your words");
    b.prompt("say your words");
    await a.until(() => deltas(a) >= 2, 20_000);
    a.send({ case: "abort", value: { reason: "changed my mind" } });
    await Promise.all([a.waitForPayload("agentEnd", 20_000), b.waitForPayload("agentEnd", 20_000)]);
    a.close();
    b.close();
    assert.equal(endOf(a.events).stopReason, StopReason.ABORTED);
    assert.equal(endOf(b.events).stopReason, StopReason.COMPLETED);
    assert.equal(replyOf(b.events), WORDS);
    // The provider stops generating the aborted reply (its stream reset), and only that one: the
    // connection both replies shared stays open.
    assert.equal(provider.unfinished - before.unfinished, 1);
    assert.equal(provider.connections, before.connections);
  });
});
