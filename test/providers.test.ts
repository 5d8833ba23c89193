// Real processes against provider conformance servers (helpers/openai-api.ts, written from the
// providers' API references): a providers file with OpenAI (a reasoning model), a provider that is
// down and a local Ollama; turns with tool calls, a fallback across providers, learning on a
// reasoning model, and a providers file the runner refuses at start.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { DECIDE_MARKER, EXTRACT_MARKER } from "../services/memory/learn.js";
import { ChatApiServer, OPENAI_MODELS, type ChatBody } from "./helpers/openai-api.js";
import { ResponsesApiServer } from "./helpers/responses-api.js";
import { AnthropicApiServer } from "./helpers/anthropic-api.js";
import { ChatSession } from "./helpers/session.js";
import { MAIN, startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";
import { endOf, of, replyOf } from "./helpers/turn-stack.js";

const run = promisify(execFile);
const KEY = "sk-e2e-conformance";
const system = (b: ChatBody) => String(b.messages[0]?.content ?? "");

/** A model that saves what the user says with memory_save, then confirms; learning gets JSON. */
function agentReply(body: ChatBody) {
  if (system(body).startsWith(EXTRACT_MARKER)) return { text: '{"facts": ["keeps bees"]}' };
  if (system(body).startsWith(DECIDE_MARKER)) return { text: '{"event": "NONE"}' };
  if (body.messages.some((m) => m.role === "tool")) return { text: "saved it" };
  return { toolCalls: [{ name: "memory_save", arguments: { text: "the user keeps bees" } }] };
}

let openai: ChatApiServer;
let down: ChatApiServer;
let ollama: ChatApiServer;
let responses: ResponsesApiServer;
let anthropic: AnthropicApiServer;
/** An OpenAI-style gateway (Azure OpenAI, LiteLLM, a proxy): OpenAI's rules, another host. */
let gateway: ChatApiServer;
let stack: Stack;
let dataDir: string;

async function open(agentId: string): Promise<ChatSession> {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { agentId, create: true } });
  await s.waitOpened();
  return s;
}

before(async () => {
  openai = await new ChatApiServer({ flavour: "openai", apiKey: KEY, reply: agentReply }).start();
  down = await new ChatApiServer({ flavour: "openai", apiKey: KEY }).start();
  down.outage = { status: 503, retryAfterSeconds: 1 };
  ollama = await new ChatApiServer({
    flavour: "ollama",
    models: [{ id: "llama3.1:8b" }],
    reply: () => ({ text: "hello from llama" }),
  }).start();
  responses = await new ResponsesApiServer({
    apiKey: KEY,
    reply: (b) =>
      b.input.some((i) => i.type === "function_call_output")
        ? { text: "noted through the Responses API" }
        : { calls: [{ name: "memory_save", arguments: { text: "the user keeps bees" } }] },
  }).start();
  anthropic = await new AnthropicApiServer({
    apiKey: KEY,
    reply: (b) =>
      JSON.stringify(b.messages).includes('"tool_result"')
        ? { text: "noted through the Messages API" }
        : { calls: [{ name: "memory_save", input: { text: "the user keeps bees" } }] },
  }).start();
  gateway = await new ChatApiServer({
    flavour: "openai",
    apiKey: KEY,
    reply: agentReply,
    // gpt-5-mini under its own name, and a reasoning model under a deployment's name.
    models: [...OPENAI_MODELS, { id: "team-reasoner", efforts: ["low", "medium", "high"] }],
  }).start();
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-providers-"));
  const providersFile = path.join(dataDir, "providers.json");
  const key = { env: "TROUPE_TEST_PROVIDER_KEY" };
  await writeFile(
    providersFile,
    JSON.stringify({
      providers: {
        openai: { kind: "openai", baseUrl: openai.baseUrl, apiKey: key },
        down: { kind: "openai", baseUrl: down.baseUrl, apiKey: key },
        local: { kind: "openai-compatible", baseUrl: ollama.baseUrl },
        responses: { kind: "openai-responses", baseUrl: responses.baseUrl, apiKey: key },
        claude: { kind: "anthropic", baseUrl: anthropic.baseUrl, apiKey: key },
        gateway: { kind: "openai-compatible", baseUrl: gateway.baseUrl, apiKey: key },
      },
      default: "openai",
    }),
  );
  const agent = (id: string, config: object) => writeAgent(dataDir, id, config);
  await agent("main", { model: "openai/gpt-5-mini", reasoningEffort: "low", temperature: 0.3 });
  await agent("failover", {
    model: "down/gpt-4.1-mini",
    fallbacks: ["openai/gpt-5-mini"],
    retry: { maxRetries: 1, baseDelayMs: 10, maxDelayMs: 100 },
  });
  await agent("local", { model: "local/llama3.1:8b", maxOutputTokens: 64 });
  await agent("reasoner", { model: "responses/gpt-5-mini", reasoningEffort: "medium" });
  await agent("claude", { model: "claude/claude-sonnet-4-6", reasoningEffort: "low" });
  await agent("gateway", { model: "gateway/gpt-5-mini", temperature: 0.3, maxOutputTokens: 512 });
  await agent("deployment", { model: "gateway/team-reasoner", temperature: 0.3, maxOutputTokens: 512 });
  stack = await startStack({
    dataDir,
    env: {
      TROUPE_PROVIDERS_FILE: providersFile,
      TROUPE_TEST_PROVIDER_KEY: KEY,
      TROUPE_MODEL: "openai/gpt-5-mini",
    },
  });
});
after(async () => {
  await stack?.stop();
  await Promise.all([
    openai?.close(),
    down?.close(),
    ollama?.close(),
    responses?.close(),
    anthropic?.close(),
    gateway?.close(),
  ]);
  await rm(dataDir, { recursive: true, force: true });
});

describe("turns through provider conformance servers", () => {
  test("gpt-5-mini: a turn with a tool call completes; every request was one the API accepts", async () => {
    const s = await open("main");
    const events = await s.turn("remember that I keep bees", 30_000);
    s.close();
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED, JSON.stringify(of(events, "error")));
    assert.equal(of(events, "toolExecutionEnd")[0]?.isError, false);
    assert.equal(replyOf(events), "saved it");
    const turns = openai.accepted.filter((b) => !system(b).startsWith("[troupe:"));
    assert.ok(turns.length >= 2, "the tool call, then the answer");
    for (const b of turns) {
      assert.equal(b.model, "gpt-5-mini");
      assert.equal(b.reasoning_effort, "low");
      assert.ok(typeof b.max_completion_tokens === "number" && !("max_tokens" in b) && !("temperature" in b));
    }
    assert.deepEqual(openai.refused, []);
    // Learning ran on the same reasoning model, asked for JSON, and was not refused either.
    await waitFor("learning's requests", async () => openai.accepted.some((b) => system(b).startsWith(EXTRACT_MARKER)));
    const learning = openai.accepted.find((b) => system(b).startsWith(EXTRACT_MARKER))!;
    assert.deepEqual(learning.response_format, { type: "json_object" });
  });

  test("a provider answering 503 hands the turn to another provider, which completes it", async () => {
    const s = await open("failover");
    const events = await s.turn("hello", 30_000);
    s.close();
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED);
    assert.ok(down.refused.length >= 1 && down.refused.every((r) => r.status === 503));
    assert.deepEqual(
      of(events, "modelFallback").map((f) => [f.fromModel, f.toModel]),
      [["down/gpt-4.1-mini", "openai/gpt-5-mini"]],
    );
    assert.equal(replyOf(events), "saved it");
  });

  test("a local Ollama gets max_tokens, the field it reads", async () => {
    const s = await open("local");
    const events = await s.turn("hi", 30_000);
    s.close();
    assert.equal(replyOf(events), "hello from llama");
    const body = ollama.accepted.at(-1)!;
    assert.equal(body.model, "llama3.1:8b");
    assert.ok(typeof body.max_tokens === "number" && !("max_completion_tokens" in body));
  });
});

describe("request rules by model, not by host", () => {
  const turns = () => gateway.accepted.filter((b) => !system(b).startsWith("[troupe:"));

  test("gpt-5-mini behind an OpenAI-style base URL: max_completion_tokens, no temperature, from the first request", async () => {
    const s = await open("gateway");
    const events = await s.turn("remember that I keep bees", 30_000);
    const plain = await s.turn("and hello", 30_000);
    s.close();
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED, JSON.stringify(of(events, "error")));
    assert.equal(of(events, "toolExecutionEnd")[0]?.isError, false, "the tool turn ran its tool");
    assert.equal(replyOf(events), "saved it");
    assert.equal(endOf(plain).stopReason, StopReason.COMPLETED);
    assert.ok(turns().length >= 3);
    for (const b of turns()) {
      assert.equal(b.model, "gpt-5-mini");
      assert.equal(b.max_completion_tokens, 512);
      assert.ok(!("max_tokens" in b) && !("temperature" in b), JSON.stringify(b).slice(0, 300));
    }
    assert.deepEqual(gateway.refused, []);
  });

  test("a model named by its deployment: what the provider refuses by name is fitted, remembered, logged once", async () => {
    const before = gateway.refused.length;
    const s = await open("deployment");
    const first = await s.turn("remember that I keep bees", 30_000);
    assert.equal(endOf(first).stopReason, StopReason.COMPLETED, JSON.stringify(of(first, "error")));
    assert.equal(replyOf(first), "saved it");
    // max_tokens was refused and replaced, then temperature refused and dropped: once each.
    assert.deepEqual(
      gateway.refused.slice(before).map((r) => [r.status, r.error.param, r.error.code]),
      [
        [400, "max_tokens", "unsupported_parameter"],
        [400, "temperature", "unsupported_value"],
      ],
    );
    const second = await s.turn("and hello", 30_000);
    s.close();
    assert.equal(endOf(second).stopReason, StopReason.COMPLETED);
    assert.equal(gateway.refused.length, before + 2, "the next requests are fitted from the start");
    const last = turns().at(-1)!;
    assert.equal(last.model, "team-reasoner");
    assert.equal(last.max_completion_tokens, 512);
    assert.ok(!("max_tokens" in last) && !("temperature" in last));
    const logged = stack
      .logs()
      .match(/provider gateway refused max_tokens for team-reasoner: sending max_completion_tokens instead/g);
    assert.equal(logged?.length, 1, "logged once");
    assert.match(stack.logs(), /provider gateway refused temperature for team-reasoner: no longer sent/);
  });
});

describe("the Responses API kind", () => {
  test("gpt-5-mini: a turn with a tool call completes, its reasoning carried across the call", async () => {
    const s = await open("reasoner");
    const events = await s.turn("remember that I keep bees", 30_000);
    s.close();
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED, JSON.stringify(of(events, "error")));
    assert.equal(replyOf(events), "noted through the Responses API");
    assert.deepEqual(responses.refused, [], "every request one the API accepts");
    const last = responses.accepted.at(-1)!;
    assert.ok(last.input.some((i) => i.type === "reasoning" && typeof i.encrypted_content === "string"));
  });
});

describe("the Anthropic kind", () => {
  test("claude-sonnet-4-6 with adaptive thinking: a turn with a tool call completes", async () => {
    const s = await open("claude");
    const events = await s.turn("remember that I keep bees", 30_000);
    s.close();
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED, JSON.stringify(of(events, "error")));
    assert.equal(replyOf(events), "noted through the Messages API");
    assert.deepEqual(anthropic.refused, [], "every request one the API accepts");
    assert.ok(anthropic.accepted.every((b) => (b.thinking as { type?: string } | undefined)?.type === "adaptive"));
  });
});

describe("a providers file the runner cannot use", () => {
  test("the runner exits 1 naming the file and the problem, never a key", async () => {
    const bad = path.join(dataDir, "bad-providers.json");
    await writeFile(
      bad,
      JSON.stringify({
        providers: {
          openai: { kind: "openai", baseUrl: "https://api.openai.com/v1", apiKey: { env: "TROUPE_TEST_MISSING_KEY" } },
        },
      }),
    );
    const res = await run(
      process.execPath,
      [MAIN, "runner", "--data-dir", dataDir, "--runner", "127.0.0.1:0", "--providers", bad],
      {
        env: { ...process.env, TROUPE_TEST_PROVIDER_KEY: KEY },
        timeout: 20_000,
      },
    ).catch((e) => e);
    assert.equal(res.code, 1, String(res.stderr));
    assert.match(
      res.stderr,
      /bad-providers\.json: providers\.openai\.apiKey: the variable TROUPE_TEST_MISSING_KEY is not set/,
    );
    assert.doesNotMatch(res.stderr, new RegExp(KEY));
  });
});
