// Anthropic's Messages API as a provider kind, against a server that checks requests as Anthropic's
// API does (helpers/anthropic-api.ts cites the references): tool use, thinking (adaptive or a
// budget, as each model takes it) carried across tool calls with its signature, and what the API
// refuses.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Role, StopReason } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { anthropicRulesFor } from "../../services/shared/models/model-rules.js";
import { parseProviders } from "../../services/shared/models/providers.js";
import { ProviderModels } from "../../services/runner/providers/provider-models.js";
import { completionFor } from "../../services/memory/completion.js";
import { AnthropicApiServer, type AnthropicBody } from "../helpers/anthropic-api.js";
import { echoTool, newActor, prompt, testRunDeps } from "../helpers/in-process.js";

const KEY = "sk-ant-test";
let api: AnthropicApiServer;
let models: ProviderModels;

const toolThenText = (body: AnthropicBody) =>
  body.messages.some(
    (m) => Array.isArray(m.content) && (m.content as { type: string }[]).some((b) => b.type === "tool_result"),
  )
    ? { text: "done with the tool" }
    : { calls: [{ name: "echo", input: { text: "hi" } }] };

before(async () => {
  api = await new AnthropicApiServer({ apiKey: KEY, reply: toolThenText }).start();
  process.env.TROUPE_TEST_ANTHROPIC_KEY = KEY;
  models = new ProviderModels(
    parseProviders(
      JSON.stringify({
        providers: {
          claude: { kind: "anthropic", baseUrl: api.baseUrl, apiKey: { env: "TROUPE_TEST_ANTHROPIC_KEY" } },
        },
      }),
      "providers.json",
    ),
  );
});
after(async () => {
  await models.close();
  await api.close();
});

/** One tool turn of an agent with `config`, through `client` (the providers above by default). */
async function turn(config: object, client: ProviderModels = models) {
  const ran: string[] = [];
  const { actor, events } = await newActor(() => testRunDeps(client, [echoTool("echo", 0, ran)], { config }));
  const from = api.accepted.length;
  await actor.submit(prompt("use your tool"));
  const end = await events.waitFor((e) => e.payload.case === "agentEnd");
  return { actor, events, end, ran, bodies: api.accepted.slice(from) };
}

/** A turn on `model` at effort low: it completes, with every request one the API accepts. */
async function thinkingTurn(model: string) {
  const t = await turn({ model: `claude/${model}`, reasoningEffort: "low", temperature: 0.3, maxOutputTokens: 4096 });
  assert.equal(
    t.end.payload.case === "agentEnd" && t.end.payload.value.stopReason,
    StopReason.COMPLETED,
    JSON.stringify(api.refused),
  );
  assert.deepEqual(api.refused, []);
  assert.deepEqual(t.ran, ["hi"]);
  return t;
}

test("a turn with a tool call and adaptive thinking completes; the signed thinking comes back first", async () => {
  const { actor, bodies, events } = await thinkingTurn("claude-sonnet-4-6");
  const [first, second] = bodies;
  assert.deepEqual(first.thinking, { type: "adaptive", display: "summarized" });
  assert.deepEqual(first.output_config, { effort: "low" });
  assert.ok(!("temperature" in first), "the API takes no temperature");
  assert.equal(typeof first.system, "string");
  assert.ok(first.messages.every((m) => m.role !== "system"));
  const asked = second.messages.at(-2)!.content as { type: string }[];
  assert.deepEqual(
    asked.map((b) => b.type),
    ["thinking", "tool_use"],
  );
  assert.ok(
    events.of("messageUpdate").some((u) => u.delta.case === "thinking"),
    "thinking streamed as thinking",
  );
  // Prompt caching is on: the conversation so far is read from the cache on later steps.
  assert.deepEqual(first.cache_control, { type: "ephemeral" });
  assert.ok(
    events.of("usage").some((u) => Number(u.usage?.cacheReadInputTokens ?? 0) > 0),
    "cache reads reported",
  );
  assert.equal(actor.history.messages.filter((m) => m.role === Role.ASSISTANT).at(-1)?.text, "done with the tool");
});

test("each model gets the thinking it takes: adaptive from 4.6 on, a budget before, the effort where taken", async () => {
  // Opus 4.7 refuses a budget; Sonnet 4.5 and Haiku 4.5 refuse adaptive thinking and the effort.
  const cases: [string, object, object | undefined][] = [
    ["claude-opus-4-7", { type: "adaptive", display: "summarized" }, { effort: "low" }],
    ["claude-opus-4-5", { type: "enabled", budget_tokens: 1024 }, { effort: "low" }],
    ["claude-sonnet-4-5", { type: "enabled", budget_tokens: 1024 }, undefined],
    ["claude-haiku-4-5", { type: "enabled", budget_tokens: 1024 }, undefined],
  ];
  for (const [model, thinking, outputConfig] of cases) {
    const { bodies } = await thinkingTurn(model);
    for (const body of bodies) {
      assert.deepEqual(body.thinking, thinking, model);
      assert.deepEqual(body.output_config, outputConfig, model);
    }
    const asked = bodies[1].messages.at(-2)!.content as { type: string }[];
    assert.equal(asked[0].type, "thinking", `${model}: the signed thinking comes back first`);
  }
});

test("Opus 4.7, which omits its thinking unless asked, streams it to the session like any model", async () => {
  const { events, bodies } = await thinkingTurn("claude-opus-4-7");
  const thought = events
    .of("messageUpdate")
    .map((u) => (u.delta.case === "thinking" ? u.delta.value : ""))
    .join("");
  assert.match(thought, /thought \d+/, "the thinking text reached the session's stream");
  assert.ok(bodies.every((b) => (b.thinking as { display?: string }).display === "summarized"));
});

test("a model near its end of life: nothing is printed beside the logs (the SDK printed a warning)", async () => {
  // Anthropic's SDK wrote two plain-text lines to stderr on every call to such a model (claude-
  // sonnet-4-5 ends on 2026-11-30), among the services' JSON log lines.
  const printed: string[] = [];
  const write = process.stderr.write;
  process.stderr.write = ((chunk: string | Uint8Array) => (printed.push(String(chunk)), true)) as typeof write;
  try {
    await thinkingTurn("claude-sonnet-4-5");
  } finally {
    process.stderr.write = write;
  }
  assert.deepEqual(printed, []);
});

test("thinkingDisplay omitted: Opus 4.7's thinking stays unshown, and its signed empty block still goes back", async () => {
  const omitting = new ProviderModels(
    parseProviders(
      JSON.stringify({
        providers: {
          claude: {
            kind: "anthropic",
            baseUrl: api.baseUrl,
            apiKey: { env: "TROUPE_TEST_ANTHROPIC_KEY" },
            thinkingDisplay: "omitted",
          },
        },
      }),
      "providers.json",
    ),
  );
  try {
    const config = { model: "claude/claude-opus-4-7", reasoningEffort: "low", maxOutputTokens: 4096 };
    const { events, end, bodies } = await turn(config, omitting);
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
    assert.deepEqual(bodies[0].thinking, { type: "adaptive", display: "omitted" });
    const thought = events.of("messageUpdate").filter((u) => u.delta.case === "thinking" && u.delta.value !== "");
    assert.deepEqual(thought, []);
    const asked = bodies[1].messages.at(-2)!.content as { type: string; thinking?: string }[];
    assert.equal(asked[0].type, "thinking");
    assert.equal(asked[0].thinking, "");
  } finally {
    await omitting.close();
  }
});

test("the providers file may name Anthropic's root with or without /v1; both reach /v1/messages", async () => {
  const root = api.baseUrl.replace(/\/v1$/, "");
  for (const baseUrl of [root, `${root}/`, `${root}/v1`, `${root}/v1/`]) {
    const ask = completionFor({ kind: "anthropic", baseUrl, apiKey: KEY }, "claude-haiku-4-5");
    const before = api.accepted.length;
    await ask("system", "hello");
    assert.equal(api.accepted.length, before + 1, baseUrl);
    assert.equal(api.accepted.at(-1)!.system, "system");
  }
});

test("the rules name Claude's models with or without their dates, and take an unnamed one to be a later one", () => {
  const budget = (effort: boolean) => ({ mode: "budget", effort });
  const expected: [string, object][] = [
    ["claude-3-7-sonnet-20250219", budget(false)],
    ["claude-sonnet-4-20250514", budget(false)],
    ["claude-sonnet-4-0", budget(false)],
    ["claude-sonnet-4-5-20250929", budget(false)],
    ["claude-opus-4-1-20250805", budget(false)],
    ["claude-haiku-4-5-20251001", budget(false)],
    ["claude-opus-4-5-20251101", budget(true)],
    ["claude-sonnet-4-6", { mode: "adaptive" }],
    ["claude-opus-4-7", { mode: "adaptive" }],
    ["claude-sonnet-5-5", { mode: "adaptive" }],
    ["claude-haiku-5-5", { mode: "adaptive" }],
  ];
  for (const [model, thinking] of expected) assert.deepEqual(anthropicRulesFor(model).thinking, thinking, model);
});

test("without an effort: no thinking; an agent's temperature is not sent; tool results go in the next user turn", async () => {
  const { end, bodies } = await turn({ model: "claude/claude-haiku-4-5", temperature: 0.3 });
  assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
  const [first, second] = bodies;
  assert.ok(!("temperature" in first) && !("thinking" in first) && !("output_config" in first));
  const results = second.messages.at(-1)!;
  assert.equal(results.role, "user");
  assert.equal((results.content as { type: string }[])[0].type, "tool_result");
});

test("a thinking budget that would not fit under max_tokens is not asked for", async () => {
  const { end, bodies } = await turn({
    model: "claude/claude-haiku-4-5",
    reasoningEffort: "high",
    maxOutputTokens: 2048,
  });
  assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
  assert.ok(bodies.every((b) => !("thinking" in b)));
  assert.deepEqual(api.refused, []);
});

test("the server refuses what the API refuses: a system role, an unknown field, a temperature, a wrong effort, a model's wrong thinking", async () => {
  const post = async (body: object) => {
    const res = await fetch(`${api.baseUrl}/messages`, {
      method: "POST",
      headers: { "x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    return {
      status: res.status,
      message: res.ok ? "" : (JSON.parse(text) as { error: { message: string } }).error.message,
    };
  };
  const base = { model: "claude-sonnet-4-5", max_tokens: 2000, messages: [{ role: "user", content: "hi" }] };
  assert.match(
    (await post({ ...base, messages: [{ role: "system", content: "x" }] })).message,
    /Unexpected role "system"/,
  );
  assert.match((await post({ ...base, max_completion_tokens: 5 })).message, /Extra inputs are not permitted/);
  assert.match((await post({ ...base, temperature: 0.2 })).message, /temperature: Extra inputs are not permitted/);
  assert.match(
    (await post({ ...base, output_config: { effort: "minimal" } })).message,
    /output_config.effort: Input should be/,
  );
  const budget = { type: "enabled", budget_tokens: 1024 };
  const refusals: [object, RegExp][] = [
    [{ ...base, model: "claude-opus-4-7", thinking: budget }, /thinking.type.enabled is not supported/],
    [{ ...base, model: "claude-sonnet-4-5", thinking: { type: "adaptive" } }, /adaptive thinking is not supported/],
    [{ ...base, model: "claude-sonnet-4-6", thinking: { type: "adaptive", budget_tokens: 1024 } }, /Extra inputs/],
    [{ ...base, model: "claude-haiku-4-5", output_config: { effort: "low" } }, /effort parameter is not supported/],
    [
      { ...base, model: "claude-opus-4-7", thinking: { type: "adaptive", display: "full" } },
      /display: Input should be/,
    ],
  ];
  for (const [body, message] of refusals) {
    const r = await post(body);
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.match(r.message, message);
  }
  // And takes what it takes: each model's own kind of thinking.
  for (const [model, thinking] of [
    ["claude-opus-4-7", { type: "adaptive" }],
    ["claude-sonnet-4-6", budget],
    ["claude-haiku-4-5", budget],
  ] as const)
    assert.equal((await post({ ...base, model, thinking })).status, 200, model);
});

test("a context longer than a request piece (64K characters), multi-byte across the cuts, reaches the API whole", async () => {
  // Pieces (pool-fetch.ts) are cut at 64K characters of the JSON body. Two runs of surrogate
  // pairs, one character out of step, each across a cut: one of the cuts falls inside a pair.
  const long = `${"😀".repeat(40_000)}a${"😀".repeat(40_000)} é 日本`;
  const from = api.accepted.length;
  const chunks = [];
  const request = {
    model: "claude/claude-sonnet-4-6",
    messages: [{ role: "user" as const, content: long }],
    tools: [],
    maxTokens: 100,
  };
  for await (const c of models.stream(request, new AbortController().signal)) chunks.push(c);
  assert.equal(chunks.at(-1)?.type, "done");
  assert.equal(api.accepted.length - from, 1);
  const content = api.accepted.at(-1)!.messages[0].content as { type: string; text: string }[];
  assert.equal(content.map((b) => b.text).join(""), long);
});
