// A streamed reply's connection after its final event (services/runner/providers/reply-rest.ts), for each
// provider protocol, against the servers written from the providers' API references
// (test/helpers/*-api.ts). Those servers end a body in the same write as its final event unless
// told otherwise; here the end comes later, never, or after bytes that should not be there.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { AnthropicModelClient } from "../../services/runner/providers/anthropic-model.js";
import { OpenAIModelClient } from "../../services/runner/providers/chat-completions-model.js";
import type { ModelChunk, ProviderClient } from "../../services/runner/providers/model.js";
import { REST_BYTES, REST_MS, untilFinalEvent } from "../../services/runner/providers/reply-rest.js";
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

// The reader of a Node body itself (its 'data' events into a queue of its own), on a stream of
// Node's own: what a caller that reads slowly, a body that fails and a caller that leaves get.
describe("a Node body, read by its events", () => {
  const KB = 1024;
  const chunk = (n: number, kb = 16) => Buffer.alloc(kb * KB, n);

  test("a caller that reads slowly holds the body back, and gets every byte in order", async () => {
    const body = new PassThrough({ highWaterMark: 16 * KB });
    const reader = untilFinalEvent(body, () => false);
    const first = reader.next();
    // 40 chunks of 16 KB written at once: the reader queues 64 KB, then pauses the body.
    let written = 0;
    for (let i = 0; i < 40; i++) if (body.write(chunk(i))) written++;
    await sleep(20);
    assert.ok(body.isPaused(), "the body flowed on past what the caller had not taken");
    assert.ok(written < 40, "the writer never saw the body full");
    body.end();
    const got: Buffer[] = [(await first).value as Buffer];
    for (let next = await reader.next(); !next.done; next = await reader.next()) {
      got.push(next.value as Buffer);
      await sleep(1);
    }
    const all = Buffer.concat(got);
    assert.equal(all.length, 40 * 16 * KB);
    for (let i = 0; i < 40; i++) assert.equal(all[i * 16 * KB], i, `chunk ${i} out of order`);
  });

  test("a body that fails: what came before the failure is read, then the failure is thrown", async () => {
    const body = new PassThrough();
    const reader = untilFinalEvent(body, () => false);
    body.write(chunk(1, 1));
    body.write(chunk(2, 1));
    await sleep(5);
    body.destroy(new Error("connection reset"));
    assert.equal(((await reader.next()).value as Buffer)[0], 1);
    assert.equal(((await reader.next()).value as Buffer)[0], 2);
    await assert.rejects(reader.next(), /connection reset/);
  });

  test("a caller waiting for a chunk learns of a failure at once", async () => {
    const body = new PassThrough();
    const reader = untilFinalEvent(body, () => false);
    const waiting = reader.next();
    body.destroy(new Error("aborted"));
    await assert.rejects(waiting, /aborted/);
  });

  test("a caller that leaves before the final event cuts the body", async () => {
    const body = new PassThrough();
    const reader = untilFinalEvent(body, () => false);
    body.write(chunk(1, 1));
    for await (const bytes of reader) {
      assert.equal((bytes as Buffer)[0], 1);
      break;
    }
    assert.ok(body.destroyed, "the body of an abandoned reply was left open");
  });

  test("after the final event the rest is read and dropped; the body ends on its own", async () => {
    const body = new PassThrough();
    let final = false;
    const reader = untilFinalEvent(body, () => final);
    body.write(chunk(1, 1));
    const got = await reader.next();
    assert.equal((got.value as Buffer)[0], 1);
    final = true;
    assert.equal((await reader.next()).done, true);
    body.write(chunk(2, 8));
    body.end();
    await sleep(20);
    assert.ok(body.readableEnded, "the rest was not read to the body's end");
    assert.equal(body.errored, null, "a body that ended within bounds was cut");
  });

  test("more than REST_BYTES after the final event cuts the body", async () => {
    const body = new PassThrough();
    let final = false;
    const reader = untilFinalEvent(body, () => final);
    body.write(chunk(1, 1));
    await reader.next();
    final = true;
    await reader.next();
    for (let i = 0; i <= REST_BYTES / (16 * KB); i++) body.write(chunk(3));
    await sleep(20);
    assert.ok(body.destroyed, "a body flooding past its final event was not cut");
  });
});
