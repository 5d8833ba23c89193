// Whether a provider serves a model, and until when (shared/models/model-lifecycle.ts), asked of servers
// that answer as the providers' model endpoints do (helpers/api-server.ts and anthropic-api.ts cite
// the references): OpenAI's shutdown_date, Anthropic's deprecation table, a 404 for a model not
// served, and nothing claimed when the provider cannot be asked.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { parseProviders } from "../../services/shared/models/providers.js";
import { ProviderModels } from "../../services/runner/providers/provider-models.js";
import { Learner } from "../../services/memory/learn.js";
import type { Logger } from "../../services/shared/process/log.js";
import { AnthropicApiServer } from "../helpers/anthropic-api.js";
import { ChatApiServer } from "../helpers/openai-api.js";
import { ResponsesApiServer } from "../helpers/responses-api.js";

const KEY = "sk-test";
let chat: ChatApiServer;
let responses: ResponsesApiServer;
let claude: AnthropicApiServer;
let local: ChatApiServer;

/** ProviderModels over the four servers (one of each kind), every key taken from `key`. */
function providersWith(key: string, logger?: ConstructorParameters<typeof ProviderModels>[1]) {
  process.env.TROUPE_TEST_LIFECYCLE_KEY = key;
  const apiKey = { env: "TROUPE_TEST_LIFECYCLE_KEY" };
  const file = {
    providers: {
      openai: { kind: "openai", baseUrl: chat.baseUrl, apiKey },
      responses: { kind: "openai-responses", baseUrl: responses.baseUrl, apiKey },
      claude: { kind: "anthropic", baseUrl: claude.baseUrl, apiKey },
      local: { kind: "openai-compatible", baseUrl: local.baseUrl },
    },
  };
  return new ProviderModels(parseProviders(JSON.stringify(file), "providers.json"), logger);
}

before(async () => {
  chat = await new ChatApiServer({ flavour: "openai", apiKey: KEY }).start();
  responses = await new ResponsesApiServer({ apiKey: KEY }).start();
  claude = await new AnthropicApiServer({ apiKey: KEY }).start();
  local = await new ChatApiServer({ flavour: "ollama" }).start();
});
after(async () => {
  await Promise.all([chat.close(), responses.close(), claude.close(), local.close()]);
});

const signal = () => AbortSignal.timeout(5000);

test("each provider says whether it serves a model and until when, as its API says it", async () => {
  const models = providersWith(KEY);
  try {
    const asked = async (model: string) => models.lifecycle(model, signal());
    // OpenAI: the Model object's shutdown_date, null when none is announced; 404 model_not_found.
    assert.deepEqual(await asked("openai/gpt-5-mini"), { served: true, endOfLife: "2026-12-11" });
    assert.deepEqual(await asked("openai/gpt-4.1-mini"), { served: true });
    assert.deepEqual(await asked("openai/gpt-5-mni"), { served: false });
    assert.deepEqual(await asked("responses/gpt-5-mini"), { served: true, endOfLife: "2026-12-11" });
    assert.deepEqual(await asked("responses/o4-mini"), { served: true });
    // Anthropic: served by its ModelInfo; the day from the deprecation table, served or not.
    assert.deepEqual(await asked("claude/claude-sonnet-4-5"), { served: true, endOfLife: "2026-11-30" });
    assert.deepEqual(await asked("claude/claude-opus-4-7"), { served: true });
    assert.deepEqual(await asked("claude/claude-sonet-4-6"), { served: false });
    // No provider of that name: not served by any.
    assert.deepEqual(await asked("nowhere/gpt-5-mini"), { served: false });
  } finally {
    await models.close();
  }
});

test("a provider that cannot be asked claims nothing: a refused key, no server, a compatible server", async () => {
  const refusedBefore = local.refused.length;
  const wrongKey = providersWith("sk-wrong");
  try {
    assert.deepEqual(await wrongKey.lifecycle("openai/gpt-5-mini", signal()), {}, "401 is not 'not served'");
    assert.deepEqual(await wrongKey.lifecycle("claude/claude-sonnet-4-6", signal()), {});
    // The table still knows Anthropic's days without an answer.
    assert.deepEqual(await wrongKey.lifecycle("claude/claude-sonnet-4-5", signal()), { endOfLife: "2026-11-30" });
    // A compatible server (a proxy maps names to models Troupe cannot see) is not asked at all.
    assert.deepEqual(await wrongKey.lifecycle("local/gpt-5-mini", signal()), {});
  } finally {
    await wrongKey.close();
  }
  assert.ok(chat.refused.some((r) => r.status === 401 && r.error.code === "invalid_api_key"));
  assert.equal(local.refused.length, refusedBefore, "the compatible server got no request");

  const gone = new ChatApiServer({ flavour: "openai", apiKey: KEY });
  await gone.start();
  const file = {
    providers: { openai: { kind: "openai", baseUrl: gone.baseUrl, apiKey: { env: "TROUPE_TEST_LIFECYCLE_KEY" } } },
  };
  await gone.close();
  const unreachable = new ProviderModels(parseProviders(JSON.stringify(file), "providers.json"));
  try {
    assert.deepEqual(await unreachable.lifecycle("openai/gpt-5-mini", signal()), {});
  } finally {
    await unreachable.close();
  }
});

/** A logger that keeps what it is given. */
function recorder() {
  const records: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
  const at = (level: string) => (msg: string, fields?: Record<string, unknown>) => records.push({ level, msg, fields });
  const logger: Logger = { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
  return { records, logger };
}

/** Waits for `n` records: the warnings come from requests made beside the calls, one round trip each. */
async function settled(records: unknown[], n: number): Promise<void> {
  for (let i = 0; i < 100 && records.length < n; i++) await new Promise((r) => setTimeout(r, 20));
  await new Promise((r) => setTimeout(r, 100));
}

test("the runner warns once per model whose provider announces its end of life, and of no other", async () => {
  const { records, logger } = recorder();
  const models = providersWith(KEY, logger);
  const refusals = () => chat.refused.length + claude.refused.length;
  try {
    const ask = async (model: string) => {
      const request = { model, messages: [{ role: "user" as const, content: "hi" }], tools: [], maxTokens: 10 };
      for await (const c of models.stream(request, new AbortController().signal)) void c;
    };
    const before = refusals();
    for (const model of ["openai/gpt-5-mini", "openai/gpt-5-mini", "openai/gpt-4.1-mini"]) await ask(model);
    for (const model of ["claude/claude-sonnet-4-5", "claude/claude-sonnet-4-5", "claude/claude-sonnet-4-6"])
      await ask(model);
    await settled(records, 2);
    assert.equal(refusals(), before, "no request was refused");
  } finally {
    await models.close();
  }
  assert.equal(records.length, 2, JSON.stringify(records));
  assert.ok(records.every((r) => r.level === "warn"));
  const byModel = new Map(records.map((r) => [r.fields?.model, r]));
  assert.deepEqual(byModel.get("openai/gpt-5-mini")?.fields, { model: "openai/gpt-5-mini", endOfLife: "2026-12-11" });
  assert.match(
    byModel.get("openai/gpt-5-mini")!.msg,
    /model openai\/gpt-5-mini (reaches its end of life|was retired) on 2026-12-11/,
  );
  assert.deepEqual(byModel.get("claude/claude-sonnet-4-5")?.fields, {
    model: "claude/claude-sonnet-4-5",
    endOfLife: "2026-11-30",
  });
});

test("learning warns once of its model's end of life, asked of its provider as the runner asks", async () => {
  const refusedBefore = local.refused.length;
  const learned = async (provider: ConstructorParameters<typeof Learner>[0], model: string) => {
    const { records, logger } = recorder();
    // The test servers answer "ok", which is no JSON of facts: learning stops before the store.
    const learner = new Learner(provider, model, {} as never, {} as never, logger);
    const scope = { tenant: "t", owner: "o", agentId: "a" };
    for (let i = 0; i < 2; i++)
      assert.deepEqual(await learner.learn(scope, "", "s", [{ role: "user", text: "I moved to Lyon" }]), []);
    await settled(records, 1);
    return records.filter((r) => r.level === "warn");
  };
  const openai = { kind: "openai" as const, baseUrl: chat.baseUrl, apiKey: KEY };
  const [retiring, ...more] = await learned(openai, "gpt-5-mini");
  assert.equal(more.length, 0, "once per process");
  assert.deepEqual(retiring.fields, { model: "gpt-5-mini", endOfLife: "2026-12-11" });
  assert.match(retiring.msg, /^learning: model gpt-5-mini (reaches its end of life|was retired) on 2026-12-11/);
  assert.deepEqual(await learned(openai, "gpt-4.1-mini"), []);
  const anthropic = { kind: "anthropic" as const, baseUrl: claude.baseUrl, apiKey: KEY };
  const [claudeWarning] = await learned(anthropic, "claude-sonnet-4-5");
  assert.deepEqual(claudeWarning?.fields, { model: "claude-sonnet-4-5", endOfLife: "2026-11-30" });
  assert.deepEqual(await learned({ kind: "openai-compatible", baseUrl: local.baseUrl, apiKey: "" }, "gpt-5-mini"), []);
  assert.equal(local.refused.length, refusedBefore, "the compatible server was not asked");
});
