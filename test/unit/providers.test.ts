// Providers and per-model request rules, against servers that check requests the way the real APIs
// do (test/helpers/openai-api.ts cites the references), not against the scripted model.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { Role, StopReason } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { OpenAIModelClient } from "../../services/runner/providers/chat-completions-model.js";
import { ModelError, type ModelChunk, type ModelRequest } from "../../services/runner/providers/model.js";
import { parseProviders, resolveModel, type Providers } from "../../services/shared/models/providers.js";
import { ProviderModels } from "../../services/runner/providers/provider-models.js";
import { ChatApiServer, type ChatBody } from "../helpers/openai-api.js";
import { ResponsesApiServer, type ResponsesBody } from "../helpers/responses-api.js";
import { echoTool, newActor, prompt, testRunDeps } from "../helpers/in-process.js";

const KEY = "sk-conformance-test";
let openai: ChatApiServer;
let ollama: ChatApiServer;
let backup: ChatApiServer;

/** Answers a tool call to `echo` first, then text, as a model asked to use its tool would. */
const toolThenText = (body: ChatBody) =>
  body.messages.some((m) => m.role === "tool")
    ? { text: "done with the tool" }
    : { toolCalls: [{ name: "echo", arguments: { text: "hi" } }] };

before(async () => {
  openai = await new ChatApiServer({ flavour: "openai", apiKey: KEY, reply: toolThenText }).start();
  backup = await new ChatApiServer({ flavour: "openai", apiKey: KEY }).start();
  ollama = await new ChatApiServer({
    flavour: "ollama",
    models: [{ id: "llama3.1:8b" }],
    reply: () => ({ text: "one two three four five six" }),
  }).start();
});
after(async () => Promise.all([openai.close(), ollama.close(), backup.close()]));

function providers(extra: Record<string, unknown> = {}, def?: string): Providers {
  process.env.TROUPE_TEST_OPENAI_KEY = KEY;
  return parseProviders(
    JSON.stringify({
      providers: {
        openai: { kind: "openai", baseUrl: openai.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
        local: { kind: "openai-compatible", baseUrl: ollama.baseUrl },
        ...extra,
      },
      ...(def ? { default: def } : {}),
    }),
    "providers.json",
  );
}

async function drain(models: ProviderModels, request: ModelRequest): Promise<ModelChunk[]> {
  const out: ModelChunk[] = [];
  for await (const c of models.stream(request, new AbortController().signal)) out.push(c);
  return out;
}
const ask = (model: string, over: Partial<ModelRequest> = {}): ModelRequest => ({
  model,
  messages: [{ role: "user", content: "one two three four five six" }],
  tools: [],
  maxTokens: 100,
  ...over,
});

describe("request rules, per model", () => {
  test("a reasoning model gets max_completion_tokens and its effort, never a temperature", async () => {
    const models = new ProviderModels(providers());
    const before = openai.accepted.length;
    await drain(models, ask("openai/gpt-5-mini", { temperature: 0.2, reasoningEffort: "low" }));
    const body = openai.accepted[before];
    assert.equal(body.model, "gpt-5-mini", "the provider prefix is not sent");
    assert.equal(body.max_completion_tokens, 100);
    assert.equal(body.reasoning_effort, "low");
    assert.ok(!("max_tokens" in body) && !("temperature" in body), JSON.stringify(body));
    // Minimal, where a model has none, is its least that still reasons; an effort it does not
    // take otherwise is left out (the model's default), never sent to be refused.
    const sent = async (model: string, reasoningEffort: ModelRequest["reasoningEffort"]) => {
      const from = openai.accepted.length;
      await drain(models, ask(`openai/${model}`, { reasoningEffort }));
      assert.equal(
        openai.accepted.length,
        from + 1,
        `${model} ${reasoningEffort}: ${JSON.stringify(openai.refused.at(-1))}`,
      );
      return openai.accepted.at(-1)!.reasoning_effort;
    };
    assert.equal(await sent("o4-mini", "minimal"), "low");
    assert.equal(await sent("gpt-5.1", "minimal"), "low");
    assert.equal(await sent("gpt-5.1", "medium"), "medium");
    assert.equal(await sent("gpt-5-mini", "minimal"), "minimal");
    assert.equal(await sent("gpt-5-pro", "low"), undefined);
    assert.equal(await sent("gpt-5-pro", "high"), "high");
    assert.equal(await sent("gpt-5.1-chat-latest", "high"), undefined);
    await models.close();
  });

  test("a chat model gets its temperature and no reasoning_effort; Ollama gets max_tokens and honours it", async () => {
    const models = new ProviderModels(providers());
    await drain(models, ask("openai/gpt-4.1-mini", { temperature: 0.2, reasoningEffort: "high" }));
    const body = openai.accepted.at(-1)!;
    assert.equal(body.temperature, 0.2);
    assert.ok(!("reasoning_effort" in body));
    const chunks = await drain(models, ask("local/llama3.1:8b", { maxTokens: 3 }));
    assert.equal(ollama.accepted.at(-1)!.max_tokens, 3);
    const done = chunks.at(-1)!;
    assert.ok(done.type === "done" && done.finishReason === "length", "the cap was read: the reply was cut");
    await models.close();
  });

  test("max_tokens to a reasoning model its name does not tell is refused, with the provider's code", async () => {
    // A deployment's name says nothing of its model, so the rules send max_tokens; a client given
    // no RequestFixes (request-fixes.ts) reports the refusal as it came.
    const deployment = await new ChatApiServer({
      flavour: "openai",
      apiKey: KEY,
      models: [{ id: "team-reasoner", efforts: ["low", "medium", "high"] }],
    }).start();
    after(() => deployment.close());
    const old = new OpenAIModelClient({ baseUrl: deployment.baseUrl, apiKey: KEY });
    const err = await (async () => {
      for await (const _ of old.stream(ask("team-reasoner"), new AbortController().signal));
    })().then(
      () => undefined,
      (e) => e,
    );
    assert.ok(err instanceof ModelError);
    assert.equal(err.status, 400);
    assert.equal(err.code, "unsupported_parameter");
    assert.match(err.message, /max_completion_tokens/);
    assert.equal(err.retryable, false);
    await old.close();
  });
});

describe("a long context", () => {
  test("longer than a request piece (64K characters), multi-byte across the cuts, it reaches the API whole", async () => {
    const models = new ProviderModels(providers());
    // Pieces (pool-fetch.ts) are cut at 64K characters of the JSON body. Two runs of surrogate
    // pairs, one character out of step, each across a cut: one of the cuts falls inside a pair.
    const long = `${"😀".repeat(40_000)}a${"😀".repeat(40_000)} é 日本`;
    const before = openai.accepted.length;
    const chunks = await drain(models, ask("openai/gpt-4.1-mini", { messages: [{ role: "user", content: long }] }));
    assert.equal(chunks.at(-1)?.type, "done");
    assert.equal(openai.accepted.length - before, 1);
    assert.equal(openai.accepted.at(-1)!.messages[0].content, long);
    await models.close();
  });
});

describe("the providers file", () => {
  test("models resolve by provider prefix; other names go whole to the default, or nowhere", async () => {
    const p = providers({}, "local");
    assert.equal(resolveModel(p, "openai/gpt-5-mini")?.provider.name, "openai");
    assert.deepEqual(
      [resolveModel(p, "meta-llama/Llama-3.1-8B")?.provider.name, resolveModel(p, "meta-llama/Llama-3.1-8B")?.model],
      ["local", "meta-llama/Llama-3.1-8B"],
    );
    const none = new ProviderModels(providers());
    const err = await drain(none, ask("gpt-5-mini")).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(err instanceof ModelError && err.code === "model_not_found", String(err));
    assert.match(err.message, /provider\/model with one of openai, local/);
    await none.close();
  });

  test("bad files are refused with every problem named; a key's value never appears", () => {
    const refuse = (doc: unknown) => {
      try {
        parseProviders(JSON.stringify(doc), "p.json");
      } catch (err) {
        return (err as Error).message;
      }
      assert.fail("accepted");
    };
    assert.match(
      refuse({ providers: { a: { kind: "anthropic-ish", baseUrl: "ftp://x" } } }),
      /providers\.a\.kind must be one of openai, openai-responses, openai-compatible, anthropic.*providers\.a\.baseUrl must be an http/,
    );
    assert.match(refuse({ providers: { "Bad Name": { kind: "openai", baseUrl: "http://x" } } }), /not allowed/);
    assert.match(
      refuse({ providers: { a: { kind: "openai", baseUrl: "http://x" } }, default: "b" }),
      /default names "b"/,
    );
    assert.match(
      refuse({ providers: { a: { kind: "openai", baseUrl: "http://x", apiKey: { env: "TROUPE_TEST_UNSET_KEY" } } } }),
      /providers\.a\.apiKey: the variable TROUPE_TEST_UNSET_KEY is not set/,
    );
    const dir = mkdtempSync(path.join(os.tmpdir(), "troupe-providers-"));
    writeFileSync(path.join(dir, "key"), "sk-from-a-file\n");
    const p = parseProviders(
      JSON.stringify({
        providers: { a: { kind: "openai", baseUrl: "http://x", apiKey: { file: path.join(dir, "key") } } },
      }),
      "p.json",
    );
    assert.equal(p.byName.get("a")?.apiKey, "sk-from-a-file");
    process.env.TROUPE_TEST_SECRET_KEY = "sk-very-secret";
    const message = refuse({
      providers: { a: { kind: "openai", baseUrl: "http://x", apiKey: { env: "TROUPE_TEST_SECRET_KEY", file: "/k" } } },
    });
    assert.match(message, /exactly one of env/);
    assert.doesNotMatch(message, /sk-very-secret/);
    assert.match(
      refuse({ providers: { a: { kind: "anthropic", baseUrl: "http://x", organization: "org-abc" } } }),
      /providers\.a: organization is OpenAI's; a anthropic provider takes none/,
    );
    assert.match(
      refuse({ providers: { a: { kind: "openai", baseUrl: "http://x", thinkingDisplay: "omitted" } } }),
      /providers\.a: thinkingDisplay is Anthropic's; a openai provider takes none/,
    );
    assert.match(
      refuse({ providers: { a: { kind: "anthropic", baseUrl: "http://x", thinkingDisplay: "full" } } }),
      /providers\.a\.thinkingDisplay/,
    );
    assert.match(
      refuse({ providers: { a: { kind: "openai", baseUrl: "http://x", project: "proj x\r\nx-injected: 1" } } }),
      /providers\.a\.project must be a project id/,
    );
    const account = parseProviders(
      JSON.stringify({
        providers: { a: { kind: "openai", baseUrl: "http://x", organization: "org-abc", project: "proj_1" } },
      }),
      "p.json",
    );
    assert.deepEqual(account.byName.get("a")?.headers, {
      "openai-organization": "org-abc",
      "openai-project": "proj_1",
    });
  });
});

describe("images for OpenAI-compatible models the providers file declares", () => {
  /** A real 1x1 PNG. */
  const PNG = Buffer.from(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "base64",
  );
  const withImage = (model: string): ModelRequest => ({
    model,
    messages: [{ role: "user", content: "what is this?", images: [{ mimeType: "image/png", data: PNG }] }],
    tools: [],
  });

  test("a declared model gets image_url parts; an undeclared one the text alone, and both are accepted", async () => {
    // Ollama's OpenAI compatibility takes images as base64 data URLs, for models that see.
    const server = await new ChatApiServer({
      flavour: "ollama",
      models: [{ id: "llava:7b" }, { id: "qwen2.5vl:3b" }, { id: "llama3.1:8b", vision: false }],
    }).start();
    const models = new ProviderModels(
      parseProviders(
        JSON.stringify({
          providers: {
            seeing: { kind: "openai-compatible", baseUrl: server.baseUrl, visionModels: ["llava*", "qwen2.5vl:3b"] },
          },
        }),
        "providers.json",
      ),
    );
    try {
      for (const model of ["seeing/llava:7b", "seeing/qwen2.5vl:3b", "seeing/llama3.1:8b"])
        await drain(models, withImage(model));
      assert.deepEqual(server.refused, []);
      const [llava, qwen, llama] = server.accepted.map((b) => b.messages.at(-1)!.content);
      for (const parts of [llava, qwen]) {
        assert.ok(Array.isArray(parts), "content parts, not a string");
        const image = (parts as { type: string; image_url?: { url: string } }[]).find((p) => p.type === "image_url");
        assert.equal(image?.image_url?.url, `data:image/png;base64,${PNG.toString("base64")}`);
      }
      assert.equal(llama, "what is this?", "a model not declared gets the text alone");
    } finally {
      await models.close();
      await server.close();
    }
  });

  test("visionModels entries are names or prefixes ending in *", () => {
    for (const bad of [["a*b"], [""], ["*"], [42]])
      assert.throws(
        () =>
          parseProviders(
            JSON.stringify({ providers: { a: { kind: "openai-compatible", baseUrl: "http://x", visionModels: bad } } }),
            "p.json",
          ),
        /providers\.a\.visionModels/,
        JSON.stringify(bad),
      );
  });
});

describe("turns through conformance servers", () => {
  test("a gpt-5-mini turn with a tool call completes; the tool result pairs with its call", async () => {
    const models = new ProviderModels(providers());
    const ran: string[] = [];
    const { actor, events } = await newActor(() =>
      testRunDeps(models, [echoTool("echo", 0, ran)], {
        config: { model: "openai/gpt-5-mini", reasoningEffort: "low" },
      }),
    );
    const before = openai.accepted.length;
    await actor.submit(prompt("use your tool"));
    const end = await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(
      end.payload.case === "agentEnd" && end.payload.value.stopReason,
      StopReason.COMPLETED,
      JSON.stringify(events.of("error")),
    );
    assert.deepEqual(ran, ["hi"]);
    assert.equal(openai.accepted.length - before, 2, "the tool call, then the answer");
    const second = openai.accepted.at(-1)!.messages;
    const asked = second.find((m) => m.role === "assistant") as { tool_calls: { id: string }[] };
    assert.equal(
      (second.find((m) => m.role === "tool") as { tool_call_id: string }).tool_call_id,
      asked.tool_calls[0].id,
    );
    assert.equal(actor.history.messages.filter((m) => m.role === Role.ASSISTANT).at(-1)?.text, "done with the tool");
    await models.close();
  });

  test("a provider answering 503 falls back to another provider and the turn completes", async () => {
    const down = await new ChatApiServer({ flavour: "openai", apiKey: KEY }).start();
    down.outage = { status: 503, retryAfterSeconds: 1 };
    const models = new ProviderModels(
      providers({
        down: { kind: "openai", baseUrl: down.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
        backup: { kind: "openai", baseUrl: backup.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
      }),
    );
    const { actor, events } = await newActor(() =>
      testRunDeps(models, [], { config: { model: "down/gpt-4.1-mini", fallbacks: ["backup/gpt-5-mini"] } }),
    );
    await actor.submit(prompt("hello"));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.ok(down.refused.length >= 1 && down.refused.every((r) => r.status === 503));
    assert.deepEqual(
      events.of("modelFallback").map((f) => [f.fromModel, f.toModel]),
      [["down/gpt-4.1-mini", "backup/gpt-5-mini"]],
    );
    assert.equal(actor.history.messages.filter((m) => m.role === Role.ASSISTANT).at(-1)?.text, "ok");
    await models.close();
    await down.close();
  });

  test("a refused request that teaches nothing is reported with the provider's message and moves to the fallback", async () => {
    // A model the provider does not serve: no field to fit, the next model answers.
    const models = new ProviderModels(
      providers({
        wrong: { kind: "openai-compatible", baseUrl: backup.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
        backup: { kind: "openai", baseUrl: backup.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
      }),
    );
    const { actor, events } = await newActor(() =>
      testRunDeps(models, [], {
        config: { model: "wrong/gpt-9-ultra", fallbacks: ["backup/gpt-5-mini"] },
      }),
    );
    await actor.submit(prompt("hello"));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    const refused = events.of("error").find((e) => e.code === "MODEL_REQUEST_REFUSED");
    assert.match(refused?.message ?? "", /wrong\/gpt-9-ultra: .*gpt-9-ultra/);
    assert.equal(events.of("modelRetry").length, 0, "a refusal is not retried");
    assert.equal(events.of("modelFallback").length, 1);
    assert.equal(actor.history.messages.filter((m) => m.role === Role.ASSISTANT).at(-1)?.text, "ok");
    await models.close();
  });
});

describe("the Responses API (openai-responses)", () => {
  const replyWithTool = (body: ResponsesBody) =>
    body.input.some((i) => i.type === "function_call_output")
      ? { text: "done with the tool" }
      : { calls: [{ name: "echo", arguments: { text: "hi" } }] };

  test("a gpt-5-mini turn with a tool call completes, its reasoning carried into the next request", async () => {
    const api = await new ResponsesApiServer({ apiKey: KEY, reply: replyWithTool }).start();
    const models = new ProviderModels(
      providers({
        resp: { kind: "openai-responses", baseUrl: api.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
      }),
    );
    const ran: string[] = [];
    const { actor, events } = await newActor(() =>
      testRunDeps(models, [echoTool("echo", 0, ran)], {
        config: { model: "resp/gpt-5-mini", reasoningEffort: "low", temperature: 0.5 },
      }),
    );
    await actor.submit(prompt("use your tool"));
    const end = await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
    assert.deepEqual(api.refused, []);
    assert.deepEqual(ran, ["hi"]);
    const [first, second] = api.accepted;
    assert.equal(first.model, "gpt-5-mini");
    assert.deepEqual(first.reasoning, { effort: "low" });
    assert.deepEqual(first.include, ["reasoning.encrypted_content"]);
    assert.equal(first.store, false);
    assert.ok(!("temperature" in first) && !("max_tokens" in first) && typeof first.max_output_tokens === "number");
    assert.equal(typeof first.instructions, "string");
    // The reasoning item came back, encrypted, before the call it led to.
    const kinds = second.input.map((i) => i.type ?? i.role);
    assert.deepEqual(kinds.slice(-3), ["reasoning", "function_call", "function_call_output"]);
    assert.equal(actor.history.messages.filter((m) => m.role === Role.ASSISTANT).at(-1)?.text, "done with the tool");
    await models.close();
    await api.close();
  });

  test("a chat model through it gets its temperature and no reasoning; the output floor is 16 tokens", async () => {
    const api = await new ResponsesApiServer({ apiKey: KEY }).start();
    const models = new ProviderModels(
      providers({
        resp: { kind: "openai-responses", baseUrl: api.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
      }),
    );
    const chunks = await drain(
      models,
      ask("resp/gpt-4.1-mini", { temperature: 0.2, reasoningEffort: "high", maxTokens: 3 }),
    );
    assert.deepEqual(api.refused, []);
    const body = api.accepted[0];
    assert.equal(body.temperature, 0.2);
    assert.ok(!("reasoning" in body) && !("include" in body));
    assert.equal(body.max_output_tokens, 16);
    assert.ok(chunks.at(-1)?.type === "done");
    await models.close();
    await api.close();
  });

  test("the server refuses what the API refuses: a reasoning item without its encrypted content", async () => {
    const api = await new ResponsesApiServer({ apiKey: KEY, reply: replyWithTool }).start();
    const res = await fetch(`${api.baseUrl}/responses`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "gpt-5-mini",
        input: [{ type: "reasoning", id: "rs_9", summary: [] }],
        stream: true,
      }),
    });
    assert.equal(res.status, 400);
    assert.match(
      ((await res.json()) as { error: { message: string } }).error.message,
      /not persisted when `store` is set to false/,
    );
    await api.close();
  });
});
