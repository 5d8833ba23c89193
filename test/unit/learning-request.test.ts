// Learning's requests against a server that checks them as OpenAI's API does: a reasoning model
// refuses temperature 0, which learning used to send, so nothing was ever learned on one.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { LocalEmbedder } from "../../services/memory/embedder.js";
import { DECIDE_MARKER, EXTRACT_MARKER, Learner } from "../../services/memory/learn.js";
import { MemoryStore } from "../../services/memory/store.js";
import { scopePredicate } from "../../services/memory/server.js";
import { ChatApiServer, type ChatBody } from "../helpers/openai-api.js";
import { AnthropicApiServer } from "../helpers/anthropic-api.js";
import { quietLogger } from "../helpers/in-process.js";

const KEY = "sk-learning-test";
let api: ChatApiServer;
let store: MemoryStore;
const system = (b: ChatBody) => String(b.messages[0]?.content ?? "");

before(async () => {
  api = await new ChatApiServer({
    flavour: "openai",
    apiKey: KEY,
    reply: (b) =>
      system(b).startsWith(EXTRACT_MARKER)
        ? { text: '{"facts": ["prefers green tea"]}' }
        : system(b).startsWith(DECIDE_MARKER)
          ? { text: '{"event": "ADD"}' }
          : { text: "?" },
  }).start();
  const embedder = new LocalEmbedder();
  const dir = mkdtempSync(path.join(os.tmpdir(), "troupe-learning-"));
  store = await MemoryStore.open(dir, {}, embedder.name, embedder.dim, quietLogger);
});
after(async () => {
  store.close();
  await api.close();
});

test("on a reasoning model, learning asks for JSON without sampling parameters, and learns", async () => {
  const embedder = new LocalEmbedder();
  const learner = new Learner(
    { kind: "openai", baseUrl: api.baseUrl, apiKey: KEY },
    "gpt-5-mini",
    store,
    embedder,
    quietLogger,
  );
  const scope = { tenant: "t", owner: "alice", agentId: "main" };
  const changes = await learner.learn(scope, scopePredicate(scope as never, true), "s1", [
    { role: "user", text: "I drink green tea every morning" },
    { role: "assistant", text: "Noted." },
  ]);
  assert.deepEqual(api.refused, [], "no request was refused");
  assert.deepEqual(
    changes.map((c) => [c.event, c.newText]),
    [["add", "prefers green tea"]],
  );
  for (const body of api.accepted) {
    assert.ok(!("temperature" in body), JSON.stringify(body));
    assert.deepEqual(body.response_format, { type: "json_object" });
  }
});

test("the same learner on the model that takes it sends temperature 0", async () => {
  const learner = new Learner(
    { kind: "openai", baseUrl: api.baseUrl, apiKey: KEY },
    "gpt-4.1-mini",
    store,
    new LocalEmbedder(),
    quietLogger,
  );
  const from = api.accepted.length;
  await learner.learn(
    { tenant: "t", owner: "bob", agentId: "main" },
    scopePredicate({ tenant: "t", owner: "bob", agentId: "main" } as never, true),
    "s2",
    [{ role: "user", text: "I live in Lyon" }],
  );
  assert.ok(api.accepted.length > from);
  assert.equal(api.accepted[from].temperature, 0);
});

test("on Anthropic's Messages API, learning asks without sampling parameters, and learns", async () => {
  const claude = await new AnthropicApiServer({
    apiKey: KEY,
    reply: (b) =>
      String(b.system).startsWith(EXTRACT_MARKER)
        ? { text: '{"facts": ["collects stamps"]}' }
        : { text: '{"event": "ADD"}' },
  }).start();
  try {
    const learner = new Learner(
      { kind: "anthropic", baseUrl: claude.baseUrl, apiKey: KEY },
      "claude-haiku-4-5",
      store,
      new LocalEmbedder(),
      quietLogger,
    );
    const scope = { tenant: "t", owner: "carol", agentId: "main" };
    const changes = await learner.learn(scope, scopePredicate(scope as never, true), "s3", [
      { role: "user", text: "I collect stamps" },
    ]);
    assert.deepEqual(claude.refused, []);
    assert.deepEqual(
      changes.map((c) => [c.event, c.newText]),
      [["add", "collects stamps"]],
    );
  } finally {
    await claude.close();
  }
});
