// The scripted model server, driven by the official openai client as the runner drives it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import http2 from "node:http2";
import https from "node:https";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { startScriptedModelServer, type RunningModelServer } from "../../services/dev/scripted-model/server.js";
import { OpenAIModelClient } from "../../services/runner/providers/chat-completions-model.js";
import { ModelError, type ModelChunk } from "../../services/runner/providers/model.js";
import { caAndServer } from "../helpers/certs.js";

let server: RunningModelServer;
let openai: OpenAI;
let model: OpenAIModelClient;
const tools = [{ name: "exec", description: "run", parameters: { type: "object" } }];

before(async () => {
  server = await startScriptedModelServer({ port: 0 });
  const baseURL = `http://127.0.0.1:${server.port}/v1`;
  openai = new OpenAI({ baseURL, apiKey: "test", maxRetries: 0 });
  model = new OpenAIModelClient({ baseUrl: baseURL, apiKey: "test" });
});
after(async () => {
  await model.close();
  await server.close();
});

async function collect(text: string, withTools = true): Promise<ModelChunk[]> {
  const out: ModelChunk[] = [];
  for await (const c of model.stream(
    { model: "scripted-1", messages: [{ role: "user", content: text }], tools: withTools ? tools : [] },
    new AbortController().signal,
  ))
    out.push(c);
  return out;
}
const textOf = (chunks: ModelChunk[]) => chunks.map((c) => (c.type === "text" ? c.delta : "")).join("");

describe("scripted model rules", () => {
  test("plain text is echoed, one token per word, with usage", async () => {
    const chunks = await collect("hello wide world");
    assert.equal(textOf(chunks), "You said: hello wide world");
    // The server sends one SSE event per word (counted through the SDK's own iterator).
    const sdkStream = await openai.chat.completions.create({
      model: "m",
      stream: true,
      messages: [{ role: "user", content: "hello wide world" }],
    });
    const contents: string[] = [];
    for await (const c of sdkStream) if (c.choices[0]?.delta.content) contents.push(c.choices[0].delta.content);
    assert.deepEqual(contents, ["You ", "said: ", "hello ", "wide ", "world"]);
    const done = chunks.at(-1)!;
    assert.ok(done.type === "done" && done.finishReason === "stop" && done.usage!.outputTokens === 5);
  });

  test("'$ CMD' calls exec; '$$ A ;; B' calls it once per command in one batch", async () => {
    const one = await collect("$ ls -l");
    const calls = one.filter((c) => c.type === "tool_call");
    const args = calls.map((c) => (c.type === "tool_call" ? c.argumentsDelta : "")).join("");
    assert.deepEqual(JSON.parse(args), { command: "ls -l" });
    assert.ok(one.at(-1)!.type === "done" && (one.at(-1) as { finishReason: string }).finishReason === "tool_calls");
    const batch = await collect("$$ echo a ;; echo b ;; echo c");
    const indexes = new Set(batch.flatMap((c) => (c.type === "tool_call" ? [c.index] : [])));
    assert.deepEqual([...indexes], [0, 1, 2]);
    const noTool = await collect("$ ls", false);
    assert.equal(textOf(noTool), "I have no exec tool here.");
  });

  test("a tool result gets an answer quoting it", async () => {
    const res = await openai.chat.completions.create({
      model: "scripted-1",
      messages: [
        { role: "user", content: "$ echo x" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "exec", arguments: "{}" } }],
        },
        { role: "tool", tool_call_id: "c1", content: "x\n[exit 0]" },
      ],
    });
    assert.equal(res.choices[0].message.content, "Tool results: x [exit 0]");
  });

  test("!tokens N streams exactly N tokens, at the given rate; paced tokens are not merged", async () => {
    const t0 = performance.now();
    const chunks = await collect("!tokens 10 rate=100");
    const ms = performance.now() - t0;
    assert.equal(textOf(chunks), Array.from({ length: 10 }, (_, i) => `t${i + 1} `).join(""));
    assert.ok(chunks.filter((c) => c.type === "text").length >= 8, "tokens 10 ms apart arrive as separate reads");
    assert.ok(ms >= 90, `10 tokens at 100/s took ${ms.toFixed(0)} ms`);
  });

  test("a long unpaced reply arrives whole (a burst larger than every socket buffer)", async () => {
    const chunks = await collect("!tokens 20000");
    const text = textOf(chunks);
    assert.equal(text.split(" ").filter(Boolean).length, 20000);
    assert.ok(text.endsWith("t20000 "));
    assert.ok(chunks.at(-1)!.type === "done");
  });

  test("!think streams reasoning before the answer", async () => {
    const chunks = await collect("!think step by step");
    assert.equal(
      chunks
        .filter((c) => c.type === "thinking")
        .map((c) => (c.type === "thinking" ? c.delta : ""))
        .join(""),
      "step by step",
    );
    assert.equal(textOf(chunks), "Thought about it.");
  });

  test("!fail answers with the status (429 with Retry-After), only the first N times with times=N", async () => {
    await assert.rejects(
      openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "!fail 429" }] }),
      (err: InstanceType<typeof OpenAI.APIError>) => {
        assert.equal(err.status, 429);
        assert.equal(err.headers?.get("retry-after"), "1");
        return true;
      },
    );
    const msg = "!fail 503 times=2";
    for (let i = 0; i < 2; i++) await assert.rejects(collect(msg), (e: ModelError) => e.status === 503 && e.retryable);
    assert.equal(textOf(await collect(msg)), "Recovered after 2 failures.");
    await assert.rejects(collect("!fail 400"), (e: ModelError) => e.status === 400 && !e.retryable);
  });

  test("!cut N cuts the stream after N tokens: a retryable error, not a hang", async () => {
    await assert.rejects(collect("!cut 3"), (e: ModelError) => e instanceof ModelError && e.retryable);
  });

  test("embeddings are deterministic and normalised", async () => {
    const a = await openai.embeddings.create({
      model: "e",
      input: ["the cat sat", "the cat sat", "stock prices fell"],
    });
    const [x, y, z] = a.data.map((d) => d.embedding);
    assert.deepEqual(x, y);
    const norm = Math.sqrt(x.reduce((s, v) => s + v * v, 0));
    assert.ok(Math.abs(norm - 1) < 1e-5);
    const dot = (p: number[], q: number[]) => p.reduce((s, v, i) => s + v * q[i], 0);
    assert.ok(dot(x, z) < 0.5);
  });

  test("an abort reaches the HTTP request", async () => {
    const ac = new AbortController();
    const it = model
      .stream({ model: "m", messages: [{ role: "user", content: "!tokens 1000 rate=50" }], tools: [] }, ac.signal)
      [Symbol.asyncIterator]();
    await it.next();
    const t0 = performance.now();
    ac.abort();
    await assert.rejects(
      (async () => {
        for (;;) if ((await it.next()).done) break;
      })(),
      (e: ModelError) => e.aborted,
    );
    assert.ok(performance.now() - t0 < 200);
  });
});

test("200 replies stream at once through one provider's pool: none waits for another to end", async () => {
  // A streamed reply holds its HTTP/1.1 connection until it ends. With the pool capped at 128,
  // the 129th reply started only once one of the first 128 had finished.
  const firsts: number[] = [];
  const ends: number[] = [];
  await Promise.all(
    Array.from({ length: 200 }, async () => {
      let first = true;
      for await (const c of model.stream(
        { model: "scripted-1", messages: [{ role: "user", content: "!tokens 20 rate=10" }], tools: [] },
        new AbortController().signal,
      ))
        if (c.type === "text" && first) {
          first = false;
          firsts.push(performance.now());
        }
      ends.push(performance.now());
    }),
  );
  assert.equal(firsts.length, 200);
  assert.ok(
    Math.max(...firsts) < Math.min(...ends),
    `every reply had begun before the first one ended (the last began ${(Math.max(...firsts) - Math.min(...ends)).toFixed(0)} ms after)`,
  );
});

describe("over HTTPS", () => {
  let tlsServer: RunningModelServer;
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "troupe-scripted-tls-"));
    caAndServer(dir, "model");
    const tls = { cert: await readFile(path.join(dir, "model.pem")), key: await readFile(path.join(dir, "model.key")) };
    tlsServer = await startScriptedModelServer({ port: 0, tls });
  });
  after(async () => {
    await tlsServer.close();
    await rm(dir, { recursive: true, force: true });
  });

  /** A streamed chat request on `session`: the body read, and the stream's RST_STREAM code (0: none). */
  function ask(session: http2.ClientHttp2Session, content: string): Promise<{ body: string; rstCode: number }> {
    const req = session.request({
      ":method": "POST",
      ":path": "/v1/chat/completions",
      "content-type": "application/json",
    });
    req.end(JSON.stringify({ model: "scripted-1", stream: true, messages: [{ role: "user", content }] }));
    let body = "";
    req.setEncoding("utf8").on("data", (d: string) => (body += d));
    req.on("error", () => undefined); // a reset stream errors; its rstCode says how it ended
    return new Promise((resolve) => req.on("close", () => resolve({ body, rstCode: req.rstCode ?? 0 })));
  }

  test("h2 is offered first; a cut reply resets its own stream, the connection's other reply completes", async () => {
    const session = http2.connect(`https://127.0.0.1:${tlsServer.port}`, {
      ca: await readFile(path.join(dir, "model-ca.pem")),
    });
    await once(session, "connect");
    assert.equal(session.alpnProtocol, "h2");
    const [cut, whole] = await Promise.all([ask(session, "!cut 3 rate=50"), ask(session, "!tokens 10 rate=50")]);
    assert.equal(cut.rstCode, http2.constants.NGHTTP2_INTERNAL_ERROR);
    assert.equal(cut.body.match(/"content":"t\d+ ?"/g)?.length, 3);
    assert.equal(whole.rstCode, 0);
    assert.match(whole.body, /"finish_reason":"stop"[\s\S]*data: \[DONE\]\n\n$/);
    assert.equal(whole.body.match(/"content":"t\d+ ?"/g)?.length, 10);
    assert.equal(session.closed || session.destroyed, false, "the connection outlived the cut");
    session.close();
  });

  test("a client that offers only http/1.1 is answered over it", async () => {
    const ca = await readFile(path.join(dir, "model-ca.pem"));
    const { status, version } = await new Promise<{ status?: number; version: string }>((resolve, reject) =>
      https
        .get(`https://127.0.0.1:${tlsServer.port}/v1/models`, { ca }, (res) => {
          res.resume();
          resolve({ status: res.statusCode, version: res.httpVersion });
        })
        .on("error", reject),
    );
    assert.deepEqual({ status, version }, { status: 200, version: "1.1" });
  });
});
