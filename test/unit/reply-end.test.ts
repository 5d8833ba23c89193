// A streamed reply's connection after its final event (services/runner/providers/reply-rest.ts), for each
// provider protocol, against the servers written from the providers' API references
// (test/helpers/*-api.ts). Those servers end a body in the same write as its final event unless
// told otherwise; here the end comes later, never, or after bytes that should not be there.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { AnthropicModelClient } from "../../services/runner/providers/anthropic-model.js";
import { OpenAIModelClient } from "../../services/runner/providers/chat-completions-model.js";
import type { ModelChunk, ProviderClient } from "../../services/runner/providers/model.js";
import { REST_BYTES, REST_MS } from "../../services/runner/providers/reply-rest.js";
import { OpenAIResponsesClient } from "../../services/runner/providers/responses-model.js";
import { AnthropicApiServer } from "../helpers/anthropic-api.js";
import type { ApiServer } from "../helpers/api-server.js";
import { ChatApiServer } from "../helpers/openai-api.js";
import { ResponsesApiServer } from "../helpers/responses-api.js";

const KEY = "sk-reply-end-test";

interface Protocol {
  name: string;
  model: string;
  start(): Promise<{ api: ApiServer; client: ProviderClient }>;
}

const PROTOCOLS: Protocol[] = [
  {
    name: "chat completions",
    model: "gpt-4.1-mini",
    async start() {
      const api = await new ChatApiServer({
        flavour: "openai",
        apiKey: KEY,
        reply: () => ({ text: "all done" }),
      }).start();
      return { api, client: new OpenAIModelClient({ kind: "openai", baseUrl: api.baseUrl, apiKey: KEY }) };
    },
  },
  {
    name: "responses",
    model: "gpt-4.1-mini",
    async start() {
      const api = await new ResponsesApiServer({ apiKey: KEY, reply: () => ({ text: "all done" }) }).start();
      return { api, client: new OpenAIResponsesClient({ kind: "openai", baseUrl: api.baseUrl, apiKey: KEY }) };
    },
  },
  {
    name: "anthropic messages",
    model: "claude-haiku-4-5",
    async start() {
      const api = await new AnthropicApiServer({ apiKey: KEY, reply: () => ({ text: "all done" }) }).start();
      return { api, client: new AnthropicModelClient({ kind: "anthropic", baseUrl: api.baseUrl, apiKey: KEY }) };
    },
  },
];

const opened: { api: ApiServer; client: ProviderClient }[] = [];
after(async () => {
  for (const { api, client } of opened) {
    await client.close();
    await api.close();
  }
});

async function call(client: ProviderClient, model: string): Promise<{ chunks: ModelChunk[]; ms: number }> {
  const t0 = performance.now();
  const chunks: ModelChunk[] = [];
  const request = { model, messages: [{ role: "user" as const, content: "hello" }], tools: [], maxTokens: 256 };
  for await (const c of client.stream(request, new AbortController().signal)) chunks.push(c);
  return { chunks, ms: performance.now() - t0 };
}

const text = (chunks: ModelChunk[]) => chunks.map((c) => (c.type === "text" ? c.delta : "")).join("");
const finished = (chunks: ModelChunk[]) => chunks.at(-1)?.type === "done";

async function until(cond: () => boolean, ms: number): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(10)) if (cond()) return true;
  return cond();
}

for (const p of PROTOCOLS) {
  describe(`${p.name}: the connection after the final event`, () => {
    test("a body that ends after its final event, in a write of its own, keeps its connection", async () => {
      const s = await p.start();
      opened.push(s);
      s.api.bodyEnd = 30;
      for (let i = 0; i < 3; i++) {
        const { chunks } = await call(s.client, p.model);
        assert.ok(finished(chunks), `call ${i} ended with ${chunks.at(-1)?.type}`);
        assert.equal(text(chunks), "all done");
        // The next call must find the connection back in the pool, not closed.
        await sleep(60);
      }
      assert.equal(s.api.connections, 1, "every call after the first reused the first call's connection");
      assert.equal(s.api.closedConnections, 0);
    });

    test("a body held open after its final event: the call ends at once, the connection is cut", async () => {
      const s = await p.start();
      opened.push(s);
      s.api.bodyEnd = "never";
      const first = await call(s.client, p.model);
      assert.ok(finished(first.chunks));
      assert.equal(text(first.chunks), "all done");
      assert.ok(first.ms < REST_MS, `the call waited ${first.ms.toFixed(0)} ms for an end that never came`);
      assert.ok(await until(() => s.api.closedConnections === 1, REST_MS + 5_000), "the held connection was not cut");
      // The pool is not left holding a dead connection: the next call is answered on a new one.
      s.api.bodyEnd = "together";
      const second = await call(s.client, p.model);
      assert.ok(finished(second.chunks));
      assert.equal(s.api.connections, 2);
    });

    test("bytes past the bound after the final event cut the connection; the reply is unchanged", async () => {
      const s = await p.start();
      opened.push(s);
      s.api.bodyEnd = { junk: 2 * REST_BYTES };
      const t0 = Date.now();
      const { chunks } = await call(s.client, p.model);
      assert.ok(finished(chunks));
      assert.equal(text(chunks), "all done");
      // Cut by the byte bound, not by the clock (the body is never ended by the server).
      assert.ok(await until(() => s.api.closedConnections === 1, REST_MS / 2), "the flooding connection was not cut");
      assert.ok(Date.now() - t0 < REST_MS, "cut only by the time bound");
    });
  });
}
