// How a provider's refusals reach the agent loop, through the openai SDK for OpenAI's kinds
// (services/shared/models/openai-sdk.ts, provider-post.ts): against the Chat Completions server written from OpenAI's
// reference (test/helpers/openai-api.ts), and a bare HTTP server for the shapes other compatible
// servers answer with.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { OpenAIModelClient } from "../../services/runner/providers/chat-completions-model.js";
import { ModelError, type ModelRequest } from "../../services/runner/providers/model.js";
import { errorOf } from "../../services/shared/models/provider-post.js";
import { BodyTooLarge } from "../../services/shared/net/bounded-body.js";
import { MAX_EVENT_CHARS } from "../../services/runner/providers/sse.js";
import { type RpcError, Status } from "../../services/shared/errors.js";
import { parseProviders, singleProvider } from "../../services/shared/models/providers.js";
import { StopReason } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { newActor, prompt, testRunDeps } from "../helpers/in-process.js";
import { ProviderModels } from "../../services/runner/providers/provider-models.js";
import { completionFor } from "../../services/memory/completion.js";
import { OpenAIEmbedder } from "../../services/memory/embedder.js";
import { ChatApiServer } from "../helpers/openai-api.js";
import { flood, type Flooded } from "../helpers/flood.js";

const KEY = "sk-provider-post-test";
const ask: ModelRequest = { model: "gpt-4.1-mini", messages: [{ role: "user", content: "hi" }], tools: [] };

/** The ModelError a whole stream ends in, or undefined when it completed. */
async function failureOf(client: OpenAIModelClient, signal = new AbortController().signal) {
  try {
    for await (const _ of client.stream(ask, signal));
    return undefined;
  } catch (err) {
    assert.ok(err instanceof ModelError, `not a ModelError: ${err}`);
    return err;
  }
}

let api: ChatApiServer;
before(async () => {
  api = await new ChatApiServer({ flavour: "openai", apiKey: KEY }).start();
});
after(() => api.close());

describe("OpenAI's refusals", () => {
  test("a wrong key: 401 with the provider's code, not retried, the key never quoted", async () => {
    const client = new OpenAIModelClient({ kind: "openai", baseUrl: api.baseUrl, apiKey: "sk-wrong-key" });
    const err = await failureOf(client);
    assert.equal(err?.status, 401);
    assert.equal(err?.code, "invalid_api_key");
    assert.equal(err?.retryable, false);
    assert.match(err!.message, /^model endpoint answered 401: /);
    assert.doesNotMatch(err!.message, /sk-wrong-key/);
    await client.close();
  });

  test("rate limited: 429 is retryable and carries the Retry-After the provider asked for", async () => {
    const client = new OpenAIModelClient({ kind: "openai", baseUrl: `${api.baseUrl}/`, apiKey: KEY });
    api.outage = { status: 429, retryAfterSeconds: 7 };
    try {
      const err = await failureOf(client);
      assert.equal(err?.status, 429);
      assert.equal(err?.retryable, true);
      assert.equal(err?.retryAfterMs, 7000);
    } finally {
      api.outage = undefined;
    }
    assert.equal(await failureOf(client), undefined, "the same client completes once the outage ends");
    await client.close();
  });
});

describe("what other compatible servers answer", () => {
  let server: http.Server;
  let base = "";
  let answer: (res: http.ServerResponse) => void = () => {};
  const seen: http.IncomingHttpHeaders[] = [];
  before(async () => {
    server = http.createServer((req, res) => {
      seen.push(req.headers);
      req.resume().on("end", () => answer(res));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });

  test("no key configured: no Authorization header at all; the JSON body goes to /chat/completions", async () => {
    answer = (res) => res.writeHead(404, { "content-type": "application/json" }).end('{"detail":"Not Found"}');
    const client = new OpenAIModelClient({ baseUrl: base, apiKey: "" });
    const err = await failureOf(client);
    const headers = seen.at(-1)!;
    assert.equal(headers.authorization, undefined);
    assert.equal(headers["content-type"], "application/json");
    assert.equal(err?.message, "model endpoint answered 404: Not Found");
    assert.equal(err?.retryable, false);
    await client.close();
  });

  test("OpenAI's kinds call through the openai SDK, which never retries on its own: the loop decides", async () => {
    answer = (res) => res.writeHead(500, { "content-type": "application/json" }).end('{"error":"boom"}');
    const providers = singleProvider(base, "k");
    const spec = providers.byName.get("default")!;
    const from = seen.length;
    const client = new OpenAIModelClient({ baseUrl: base, apiKey: "k" });
    assert.equal((await failureOf(client))?.retryable, true, "a 500 is retryable, for the loop to retry");
    await client.close();
    await new OpenAIEmbedder(spec.baseUrl, spec.apiKey, "e", 8).embed(["x"]).catch(() => undefined);
    const sent = seen.slice(from);
    // One request from the model call; the embedder's postForJson tries twice, itself.
    assert.equal(sent.length, 3, `${sent.length} requests: the SDK retried on its own`);
    for (const h of sent) {
      assert.match(String(h["user-agent"]), /^OpenAI\/JS /, "made by the openai SDK");
      assert.equal(h["x-stainless-retry-count"], "0");
    }
  });

  test("OPENAI_ORG_ID and OPENAI_PROJECT_ID reach every call as OpenAI's account headers", async () => {
    // platform.openai.com/docs/api-reference/authentication: OpenAI-Organization, OpenAI-Project.
    answer = (res) => res.writeHead(503, { "content-type": "application/json" }).end('{"error":"busy"}');
    const providers = singleProvider(base, "k", { organization: "org-abc", project: "proj_1" });
    const spec = providers.byName.get("default")!;
    const from = seen.length;
    const models = new ProviderModels(providers);
    const drained = (async () => {
      for await (const _ of models.stream(ask, new AbortController().signal));
    })();
    await drained.catch(() => undefined);
    await models.close();
    await completionFor(spec, "m")("system", "user").catch(() => undefined);
    await new OpenAIEmbedder(spec.baseUrl, spec.apiKey, "e", 8, spec.headers).embed(["x"]).catch(() => undefined);
    const sent = seen.slice(from);
    assert.ok(sent.length >= 3, `${sent.length} requests`);
    for (const h of sent) {
      assert.equal(h["openai-organization"], "org-abc");
      assert.equal(h["openai-project"], "proj_1");
      assert.equal(h.authorization, "Bearer k");
    }
  });

  test("a 5xx answering a megabyte of HTML: retryable, its message bounded", async () => {
    const page = `<html>${"x".repeat(1024 * 1024)}</html>`;
    answer = (res) => res.writeHead(502, { "content-type": "text/html" }).end(page);
    const client = new OpenAIModelClient({ baseUrl: base, apiKey: "k" });
    const err = await failureOf(client);
    assert.equal(err?.status, 502);
    assert.equal(err?.retryable, true);
    assert.ok(err!.message.length < 600, `message of ${err!.message.length} characters`);
    await client.close();
  });

  test("aborted while waiting for the answer: an aborted ModelError, not a retry", async () => {
    answer = () => {}; // never answers
    const client = new OpenAIModelClient({ baseUrl: base, apiKey: "k" });
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 100);
    const err = await failureOf(client, abort.signal);
    assert.equal(err?.aborted, true);
    assert.equal(err?.retryable, false);
    await client.close();
  });

  test("a stream whose event never ends: stopped at the decoder's bound, not tried again", async () => {
    // 48 MiB of one data line with no line end, then the body ends. Before the bound the runner
    // read all of it into one string and failed on the JSON, as retryable.
    let flooded!: Promise<Flooded>;
    answer = (res) => void (flooded = flood(res, "text/event-stream", "data: ", "x", 48 * 1024 * 1024));
    const client = new OpenAIModelClient({ baseUrl: base, apiKey: "k" });
    const err = await failureOf(client);
    assert.equal(err?.retryable, false);
    assert.equal(
      err?.message,
      `the model stream sent an event of more than ${MAX_EVENT_CHARS} characters without ending it`,
    );
    const { sent, cut } = await flooded;
    assert.ok(cut, "the runner let the connection go");
    assert.ok(sent < 32 * 1024 * 1024, `${sent} bytes sent before it did`);
    await client.close();
  });

  test("a turn whose model breaks the bound moves to its fallback and completes there", async () => {
    let flooded!: Promise<Flooded>;
    answer = (res) => void (flooded = flood(res, "text/event-stream", "data: ", "x", 48 * 1024 * 1024));
    process.env.TROUPE_TEST_OPENAI_KEY = KEY;
    const models = new ProviderModels(
      parseProviders(
        JSON.stringify({
          providers: {
            broken: { kind: "openai-compatible", baseUrl: base },
            good: { kind: "openai", baseUrl: api.baseUrl, apiKey: { env: "TROUPE_TEST_OPENAI_KEY" } },
          },
        }),
        "providers.json",
      ),
    );
    try {
      const { actor, events } = await newActor(() =>
        testRunDeps(models, [], { config: { model: "broken/m", fallbacks: ["good/gpt-4.1-mini"] } }),
      );
      await actor.submit(prompt("hello"));
      const end = await events.waitFor((e) => e.payload.case === "agentEnd");
      assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
      const [fallback] = events.of("modelFallback");
      assert.equal(fallback?.fromModel, "broken/m");
      assert.match(fallback?.reason ?? "", /more than \d+ characters without ending it/);
      assert.equal(events.of("modelRetry").length, 0, "not tried again");
      assert.equal(actor.history.messages.at(-1)?.text, "ok");
      assert.ok((await flooded).cut);
    } finally {
      await models.close();
    }
  });

  test("an embeddings or learning answer (OpenAI's kinds and Anthropic's) past its bound: refused, not read on, not tried again", async () => {
    // An endless array of numbers. An embedding of 8 numbers for one text has a bound of about
    // 65 KB; a learning answer, 16 MiB.
    const floods: Promise<Flooded>[] = [];
    answer = (res) =>
      void floods.push(flood(res, "application/json", '{"data":[{"index":0,"embedding":[', "0.125,", 48 * 1024 * 1024));
    await assert.rejects(
      new OpenAIEmbedder(base, "k", "e", 8).embed(["x"]),
      (err: RpcError) => err.code === Status.UNAVAILABLE && /the answer is longer than \d+ bytes/.test(err.message),
    );
    await assert.rejects(
      completionFor({ kind: "openai-compatible", baseUrl: base, apiKey: "k" }, "m")("system", "user"),
      (err: Error) => err instanceof BodyTooLarge && err.limit === 16 * 1024 * 1024,
    );
    await assert.rejects(
      completionFor({ kind: "anthropic", baseUrl: `${base}`, apiKey: "k" }, "claude-haiku-4-5")("system", "user"),
      (err: Error) => err instanceof BodyTooLarge && err.limit === 16 * 1024 * 1024,
    );
    assert.equal(floods.length, 3, "each asked once");
    for (const { sent, cut } of await Promise.all(floods)) {
      assert.ok(cut, "the service let the connection go");
      assert.ok(sent < 32 * 1024 * 1024, `${sent} bytes sent before it did`);
    }
  });

  test("nothing listening: retryable, said to be unreachable", async () => {
    const client = new OpenAIModelClient({ baseUrl: "http://127.0.0.1:1/v1", apiKey: "k" });
    const err = await failureOf(client);
    assert.equal(err?.retryable, true);
    assert.match(err!.message, /^model endpoint unreachable: /);
    await client.close();
  });
});

describe("error bodies", () => {
  test("each shape gives its message and code", () => {
    const shapes: [string, { message: string; code?: string }][] = [
      ['{"error":{"message":"m","type":"t","code":"c"}}', { message: "m", code: "c" }],
      ['{"error":{"message":"m","code":null}}', { message: "m", code: undefined }],
      ['{"error":"plain"}', { message: "plain" }],
      ['{"message":"top"}', { message: "top" }],
      ['{"detail":[{"loc":["body"],"msg":"bad"}]}', { message: '[{"loc":["body"],"msg":"bad"}]' }],
      ["Bad Gateway\n", { message: "Bad Gateway" }],
      ["null", { message: "null" }],
    ];
    for (const [text, want] of shapes) assert.deepEqual(errorOf(text), want, text);
  });

  test("a long message is cut in every shape, and says so", () => {
    const long = `${"why ".repeat(3000)}end`;
    const bodies = [
      JSON.stringify({ error: { message: long, code: "c" } }),
      JSON.stringify({ error: long }),
      JSON.stringify({ message: long }),
      JSON.stringify({ detail: long }),
      JSON.stringify({ detail: [{ msg: long }] }),
      long,
    ];
    for (const body of bodies) {
      const { message } = errorOf(body);
      assert.equal(message.length, 500, body.slice(0, 40));
      assert.ok(message.endsWith("…"), body.slice(0, 40));
      assert.ok(!message.includes("end"), body.slice(0, 40));
    }
    assert.equal(errorOf(JSON.stringify({ error: { message: "short" } })).message, "short");
  });
});
