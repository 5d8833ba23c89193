// The SDKs' fetch over an undici pool, against a real HTTP server: what a Response gives must be
// what fetch gives, and the runner's direct read of a streamed body must see every byte.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { brotliCompressSync, gzipSync } from "node:zlib";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import OpenAI from "openai";
import { Agent } from "undici";
import { poolFetch, replyBody } from "../../services/runner/providers/pool-fetch.js";
import { collectLastResort } from "../../services/shared/process/idle-trim.js";

let server: http.Server;
let base: string;
// Node's warnings, from before the fetch is made: a warning is a plain line among a service's JSON
// logs (test/logs.test.ts), and undici's experimental interceptors print one when created.
const warnings: string[] = [];
process.on("warning", (w) => void warnings.push(w.message));
const pool = new Agent({ connections: 8 });
const fetchOverPool = poolFetch(pool);

before(async () => {
  server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    let body = "";
    // A reply left open must not keep what it was sent (a test measures what the client holds).
    const keep = req.url !== "/slow" && req.url !== "/v1/chat/completions";
    req.on("data", (c: Buffer) => keep && parts.push(c));
    req.on("end", () => {
      body = Buffer.concat(parts).toString();
      if (req.url === "/stream") {
        res.writeHead(200, { "content-type": "text/event-stream" });
        // The first chunk is written at once, the rest later: a read ahead would take the first.
        res.write("data: one\n\n");
        setTimeout(() => {
          res.write("data: two\n\n");
          res.end("data: [DONE]\n\n");
        }, 20);
      } else if (req.url === "/slow" || req.url === "/v1/chat/completions") {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write("data: first\n\n");
      } else if (req.url === "/moved") {
        res.writeHead(307, { location: "/echo?moved=1" });
        res.end();
      } else if (req.url === "/see-other") {
        res.writeHead(303, { location: "/echo?seen=1" });
        res.end("see there");
      } else if (req.url === "/elsewhere") {
        // Another origin: the same server by another host name.
        res.writeHead(307, { location: `${base.replace("127.0.0.1", "localhost")}/echo?far=1` });
        res.end();
      } else if (req.url === "/elsewhere-headers") {
        res.writeHead(308, { location: `${base.replace("127.0.0.1", "localhost")}/headers` });
        res.end();
      } else if (req.url === "/headers") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(req.headers));
      } else if (req.url === "/loop") {
        res.writeHead(302, { location: "/loop" });
        res.end();
      } else if (req.url === "/to-file") {
        res.writeHead(307, { location: "file:///etc/passwd" });
        res.end();
      } else if (req.url === "/digest" || req.url === "/moved-digest") {
        if (req.url === "/moved-digest") {
          res.writeHead(308, { location: "/digest" });
          return res.end();
        }
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            text: body,
            contentLength: req.headers["content-length"] ?? "",
            chunked: req.headers["transfer-encoding"] ?? "",
          }),
        );
      } else if (req.url === "/found") {
        res.writeHead(302, { location: "/echo?found=1" });
        res.end();
      } else if (req.url === "/gzip") {
        res.writeHead(200, { "content-type": "text/event-stream", "content-encoding": "gzip" });
        res.end(gzipSync("data: packed\n\n"));
      } else if (req.url === "/brotli") {
        res.writeHead(200, { "content-type": "application/json", "content-encoding": "br" });
        res.end(brotliCompressSync('{"packed":"br"}'));
      } else if (req.url === "/empty") {
        res.writeHead(205);
        res.end();
      } else if (req.url === "/refuse") {
        res.writeHead(429, [
          ["content-type", "application/json"],
          ["retry-after", "3"],
          ["x-multi", "a"],
          ["x-multi", "b"],
        ]);
        res.end(JSON.stringify({ error: { message: "slow down", code: "rate_limit" } }));
      } else {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ method: req.method, url: req.url, body, auth: req.headers.authorization ?? "" }));
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  await pool.close();
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

/** A flat string (one piece in memory, as a parsed message is), made where its bytes die at once. */
const flatText = (length: number): string => Buffer.alloc(length, "x").toString();

async function readAll(body: AsyncIterable<Uint8Array>): Promise<string> {
  let out = "";
  for await (const chunk of body) out += Buffer.from(chunk).toString();
  return out;
}

describe("poolFetch", () => {
  test("sends the method, path, query, headers and body; the Response reads as fetch's does", async () => {
    const res = await fetchOverPool(`${base}/echo?x=1`, {
      method: "post",
      headers: { authorization: "Bearer k", "content-type": "application/json" },
      body: '{"a":1}',
    });
    assert.equal(res.status, 200);
    assert.equal(res.ok, true);
    assert.equal(res.headers.get("content-type"), "application/json");
    assert.deepEqual(await res.json(), { method: "POST", url: "/echo?x=1", body: '{"a":1}', auth: "Bearer k" });
  });

  test("redirects are followed as fetch follows them: 307 keeps the method and body, 302 turns a POST into a GET", async () => {
    const kept = await fetchOverPool(`${base}/moved`, { method: "POST", body: "again" });
    assert.deepEqual(await kept.json(), { method: "POST", url: "/echo?moved=1", body: "again", auth: "" });
    const changed = await fetchOverPool(`${base}/found`, { method: "POST", body: "dropped" });
    assert.deepEqual(await changed.json(), { method: "GET", url: "/echo?found=1", body: "", auth: "" });
  });

  test("a 303 turns any method into a GET without its body; content headers go with it", async () => {
    const res = await fetchOverPool(`${base}/see-other`, {
      method: "PUT",
      headers: { "content-type": "text/plain" },
      body: "dropped",
    });
    assert.deepEqual(await res.json(), { method: "GET", url: "/echo?seen=1", body: "", auth: "" });
  });

  test("a redirect to another origin drops the credentials; one to the same origin keeps them", async () => {
    const far = await fetchOverPool(`${base}/elsewhere`, {
      method: "POST",
      headers: { authorization: "Bearer secret" },
      body: "kept",
    });
    assert.deepEqual(await far.json(), { method: "POST", url: "/echo?far=1", body: "kept", auth: "" });
    // Every provider's key header counts as a credential; other headers go on.
    const keys = { "x-api-key": "sk-ant", "api-key": "azure", cookie: "c=1", "x-request-tag": "kept" };
    const seen = (await (await fetchOverPool(`${base}/elsewhere-headers`, { headers: keys })).json()) as Record<
      string,
      string
    >;
    assert.deepEqual(
      Object.keys(keys).filter((k) => k in seen),
      ["x-request-tag"],
    );
    const near = await fetchOverPool(`${base}/moved`, {
      method: "POST",
      headers: { authorization: "Bearer k" },
      body: "b",
    });
    assert.equal(((await near.json()) as { auth: string }).auth, "Bearer k");
  });

  test("more than 20 redirects, or one to another scheme, fail as fetch fails: a TypeError", async () => {
    await assert.rejects(
      fetchOverPool(`${base}/loop`),
      (err: Error) => err instanceof TypeError && /20 redirects/.test(err.message),
    );
    await assert.rejects(
      fetchOverPool(`${base}/to-file`),
      (err: Error) => err instanceof TypeError && /file:/.test(err.message),
    );
    // The pool still serves after both.
    assert.equal((await fetchOverPool(`${base}/echo`)).status, 200);
  });

  // A long body goes out in pieces: each must end on a whole character, and the server must see
  // the length it was told, not a chunked body.
  test("a long body arrives whole, with its length, characters across piece boundaries intact, after a 308 too", async () => {
    const text = "é😀x".repeat(100_000) + "😀".repeat(40_000);
    for (const path of ["/digest", "/moved-digest"]) {
      const res = await fetchOverPool(`${base}${path}`, { method: "POST", body: text });
      const got = (await res.json()) as { text: string; contentLength: string; chunked: string };
      assert.equal(got.text === text, true, `${path}: the body arrived changed`);
      assert.equal(got.contentLength, String(Buffer.byteLength(text)));
      assert.equal(got.chunked, "");
    }
  });

  // A streamed reply can last minutes; a runner's request bodies (the whole context) must not be
  // held that long, or they pile up in the old generation (bench/history.md, the long soak).
  test("through the SDK, a long request body is not held while its reply streams", async () => {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "k", maxRetries: 0, fetch: fetchOverPool as never });
    const held = () => {
      collectLastResort();
      const m = process.memoryUsage();
      return m.heapUsed + m.arrayBuffers;
    };
    // The conversation is the session's and stays; what must not stay is its copies in the request.
    const context = flatText(16 * 1024 * 1024);
    await new Promise((resolve) => setImmediate(resolve));
    const before = held();
    const controller = new AbortController();
    const body = await (async () =>
      replyBody(
        await client.chat.completions
          .create(
            { model: "m", messages: [{ role: "user", content: context }], stream: true },
            { signal: controller.signal },
          )
          .asResponse(),
      ))();
    assert.ok(body);
    const reader = body[Symbol.asyncIterator]();
    assert.equal(Buffer.from((await reader.next()).value as Uint8Array).toString(), "data: first\n\n");
    const grew = held() - before;
    controller.abort();
    await reader.next().catch(() => undefined);
    assert.ok(grew < 4 * 1024 * 1024, `${(grew / 1024 / 1024).toFixed(1)} MB still held while the reply streams`);
    assert.equal(context.length, 16 * 1024 * 1024);
  });

  test("a compressed answer is read decompressed, directly too, and nothing is said on stderr", async () => {
    const res = await fetchOverPool(`${base}/gzip`);
    const body = replyBody(res);
    assert.ok(body);
    assert.equal(await readAll(body), "data: packed\n\n");
    assert.deepEqual(await (await fetchOverPool(`${base}/brotli`)).json(), { packed: "br" });
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(warnings, []);
  });

  test("a status that may carry no body gives a Response without one", async () => {
    const res = await fetchOverPool(`${base}/empty`);
    assert.equal(res.status, 205);
    assert.equal(replyBody(res), null);
  });

  test("a refusal keeps its status, every header value and its body", async () => {
    const res = await fetchOverPool(`${base}/refuse`, { method: "POST", body: new TextEncoder().encode("{}") });
    assert.equal(res.status, 429);
    assert.equal(res.ok, false);
    assert.equal(res.headers.get("retry-after"), "3");
    assert.equal(res.headers.get("x-multi"), "a, b");
    assert.deepEqual(await res.json(), { error: { message: "slow down", code: "rate_limit" } });
  });

  test("the runner's direct read of a streamed body gets every byte, the first included", async () => {
    const res = await fetchOverPool(`${base}/stream`);
    // Let a read ahead, if there were one, take the first chunk before the runner reads.
    await new Promise((resolve) => setTimeout(resolve, 10));
    const body = replyBody(res);
    assert.ok(body);
    assert.equal(await readAll(body), "data: one\n\ndata: two\n\ndata: [DONE]\n\n");
  });

  test("the same body read through the Response instead", async () => {
    const res = await fetchOverPool(`${base}/stream`);
    assert.equal(await res.text(), "data: one\n\ndata: two\n\ndata: [DONE]\n\n");
  });

  test("an abort in the middle of a body ends its read with an error", async () => {
    const controller = new AbortController();
    const res = await fetchOverPool(`${base}/slow`, { signal: controller.signal });
    const body = replyBody(res);
    assert.ok(body);
    const chunks: string[] = [];
    await assert.rejects(async () => {
      for await (const chunk of body) {
        chunks.push(Buffer.from(chunk).toString());
        controller.abort();
      }
    });
    assert.deepEqual(chunks, ["data: first\n\n"]);
  });

  // The runner keeps only the Node body, not the Response. openai's SDK passes the caller's abort on
  // through AbortSignal.any (its fallback holds the callback only while the Response's web body
  // lives): this guards that an abort still ends the read after the Response is collected.
  test("through the SDK, the caller's abort still reaches a body read directly once the Response is collected", async () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "k", maxRetries: 0, fetch: fetchOverPool as never });
    const controller = new AbortController();
    let collected = false;
    const registry = new FinalizationRegistry(() => {
      collected = true;
    });
    // The Response goes out of scope here, as it does in the runner once the body is taken.
    const body = await (async () => {
      const res = await client.chat.completions
        .create(
          { model: "m", messages: [{ role: "user", content: "hi" }], stream: true },
          { signal: controller.signal },
        )
        .asResponse();
      registry.register(res, "response");
      return replyBody(res);
    })();
    assert.ok(body);
    for (let i = 0; i < 20 && !collected; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      gc();
    }
    assert.ok(collected, "the Response was collected");
    const read = (async () => {
      for await (const _ of body) controller.abort();
    })();
    const outcome = await Promise.race([
      read.then(
        () => "ended",
        () => "aborted",
      ),
      new Promise((resolve) => setTimeout(() => resolve("still reading"), 3000)),
    ]);
    assert.equal(outcome, "aborted");
  });

  test("an abort before the answer rejects the fetch", async () => {
    const controller = new AbortController();
    controller.abort();
    await assert.rejects(fetchOverPool(`${base}/echo`, { signal: controller.signal }));
  });

  test("a body it cannot send is a TypeError, as fetch would say, not a silent empty body", async () => {
    await assert.rejects(fetchOverPool(`${base}/echo`, { method: "POST", body: { a: 1 } }), TypeError);
  });

  test("a Response made elsewhere gives its own body", async () => {
    const res = new Response("plain");
    const body = replyBody(res);
    assert.ok(body);
    assert.equal(await readAll(body), "plain");
    assert.equal(replyBody(new Response(null)), null);
  });
});
