// Outbound calls through an HTTP proxy (services/shared/net/outbound-proxy.ts), against a forward proxy
// written from the RFCs (test/helpers/http-proxy.ts) and providers written from their API
// references. The providers listen on 127.0.0.2: loopback still, but not an address Troupe always
// reaches directly. The proxy setting is the process's, so each test sets the one it needs.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { OpenAIModelClient } from "../../services/runner/providers/chat-completions-model.js";
import { ModelError, type ModelChunk } from "../../services/runner/providers/model.js";
import { OpenAIEmbedder } from "../../services/memory/embedder.js";
import { effectiveEnvironment, loadConfig } from "../../services/shared/config/config.js";
import { alwaysDirect, proxyFor, proxyHosts, useOutboundProxy } from "../../services/shared/net/outbound-proxy.js";
import { ChatApiServer } from "../helpers/openai-api.js";
import { EmbeddingsApiServer } from "../helpers/embeddings-api.js";
import { HttpProxy } from "../helpers/http-proxy.js";

const KEY = "sk-proxy-test";
let proxy: HttpProxy;
let guarded: HttpProxy;
let api: ChatApiServer;
let local: ChatApiServer;

before(async () => {
  proxy = await new HttpProxy().start();
  guarded = await new HttpProxy("troupe:s3cret").start();
  api = await new ChatApiServer({ flavour: "openai", apiKey: KEY, reply: () => ({ text: "through" }) }).start(
    "127.0.0.2",
  );
  local = await new ChatApiServer({ flavour: "openai", apiKey: KEY, reply: () => ({ text: "direct" }) }).start();
});
after(async () => Promise.all([proxy.close(), guarded.close(), api.close(), local.close()]));

async function ask(server: ChatApiServer): Promise<string> {
  const client = new OpenAIModelClient({ kind: "openai", baseUrl: server.baseUrl, apiKey: KEY });
  try {
    const chunks: ModelChunk[] = [];
    const request = { model: "gpt-4.1-mini", messages: [{ role: "user" as const, content: "hi" }], tools: [] };
    for await (const c of client.stream(request, new AbortController().signal)) chunks.push(c);
    assert.equal(chunks.at(-1)?.type, "done");
    return chunks.map((c) => (c.type === "text" ? c.delta : "")).join("");
  } finally {
    await client.close();
  }
}

const seenSince = (p: HttpProxy, n: number) => p.seen.slice(n).map((r) => `${r.method} ${r.target}`);

describe("model calls", () => {
  test("an http:// provider is called through HTTP_PROXY, in absolute form, and answers as before", async () => {
    useOutboundProxy({ httpProxy: proxy.url });
    const n = proxy.seen.length;
    const accepted = api.accepted.length;
    assert.equal(await ask(api), "through");
    assert.deepEqual(seenSince(proxy, n), [`POST ${api.baseUrl}/chat/completions`]);
    assert.equal(api.accepted.length, accepted + 1);
  });

  test("an https:// provider is reached through a CONNECT tunnel; the proxy's own failure is retried", async () => {
    useOutboundProxy({ httpsProxy: proxy.url });
    const n = proxy.seen.length;
    // Nothing listens there: the proxy answers the CONNECT with 502.
    const client = new OpenAIModelClient({ kind: "openai", baseUrl: "https://127.0.0.2:9/v1", apiKey: KEY });
    const request = { model: "gpt-4.1-mini", messages: [{ role: "user" as const, content: "hi" }], tools: [] };
    const failed = await (async () => {
      for await (const _ of client.stream(request, new AbortController().signal));
    })().then(
      () => undefined,
      (err: unknown) => err,
    );
    await client.close();
    assert.deepEqual(seenSince(proxy, n), ["CONNECT 127.0.0.2:9"]);
    assert.ok(failed instanceof ModelError);
    assert.match(failed.message, /the outbound proxy refused the call with 502/);
    assert.equal(failed.retryable, true);
  });

  test("HTTPS_PROXY alone leaves http:// providers direct", async () => {
    useOutboundProxy({ httpsProxy: proxy.url });
    const n = proxy.seen.length;
    assert.equal(await ask(api), "through");
    assert.deepEqual(seenSince(proxy, n), []);
  });

  test("a host NO_PROXY lists, and loopback always, are reached directly", async () => {
    useOutboundProxy({ httpProxy: proxy.url, noProxy: "example.com, 127.0.0.2" });
    const n = proxy.seen.length;
    assert.equal(await ask(api), "through");
    useOutboundProxy({ httpProxy: proxy.url });
    assert.equal(await ask(local), "direct");
    assert.deepEqual(seenSince(proxy, n), []);
  });

  test("a proxy's credentials go from its URL to Proxy-Authorization; without them the call fails with 407", async () => {
    const port = new URL(guarded.url).port;
    useOutboundProxy({ httpProxy: `http://troupe:s3cret@127.0.0.1:${port}` });
    assert.equal(await ask(api), "through");
    useOutboundProxy({ httpProxy: guarded.url });
    const failed = await ask(api).then(
      () => undefined,
      (err: unknown) => err,
    );
    assert.ok(failed instanceof ModelError, `expected a ModelError, got ${String(failed)}`);
    assert.match(failed.message, /the outbound proxy refused the call with 407 .*user:password/);
    assert.equal(failed.retryable, false, "a refusal of credentials is not tried again");
    assert.deepEqual(
      guarded.seen.map((r) => r.method),
      ["POST", "POST"],
    );
  });
});

test("Node's own fetch takes the proxy too: the memory service's embedding calls", async () => {
  const embeddings = await new EmbeddingsApiServer(KEY).start("127.0.0.2");
  try {
    useOutboundProxy({ httpProxy: proxy.url });
    const n = proxy.seen.length;
    const [vector] = await new OpenAIEmbedder(embeddings.baseUrl, KEY, "text-embedding-3-small", 1536).embed(["hi"]);
    assert.equal(vector.length, 1536);
    assert.deepEqual(seenSince(proxy, n), [`POST ${embeddings.baseUrl}/embeddings`]);
  } finally {
    await embeddings.close();
  }
});

describe("configuration", () => {
  test("HTTPS_PROXY, HTTP_PROXY and NO_PROXY are read, the lower-case names first", () => {
    const cfg = loadConfig([], {
      HTTPS_PROXY: "http://upper:3128",
      https_proxy: "http://lower:3128",
      HTTP_PROXY: "http://plain:3128",
      no_proxy: ".internal",
    });
    assert.deepEqual(cfg.outboundProxy, {
      httpsProxy: "http://lower:3128",
      httpProxy: "http://plain:3128",
      noProxy: ".internal",
    });
    assert.equal(loadConfig([], {}).outboundProxy, undefined);
  });

  test("a proxy that is not an http(s) URL is refused at start, by the name it was given", () => {
    assert.throws(
      () => loadConfig([], { https_proxy: "socks5://127.0.0.1:1080" }),
      /https_proxy must be an http:\/\/ or https:\/\/ URL of the proxy/,
    );
    assert.throws(() => loadConfig([], { HTTP_PROXY: "http://proxy:3128/path" }), /HTTP_PROXY must be an http:\/\//);
    // Without a scheme, as many hosts set it: an http:// proxy.
    assert.equal(loadConfig([], { http_proxy: "proxy.corp:3128" }).outboundProxy?.httpProxy, "http://proxy.corp:3128");
  });

  test("troupe config masks a proxy URL, and troupe status names only its host (it may carry credentials)", () => {
    const shown = effectiveEnvironment({ https_proxy: "http://user:pw@proxy:3128" });
    assert.equal(shown.find((v) => v.name === "HTTPS_PROXY")?.value, "****");
    const proxy = loadConfig([], { https_proxy: "http://user:pw@proxy:3128", HTTP_PROXY: "other:8080" }).outboundProxy!;
    assert.equal(proxyHosts(proxy), "proxy:3128 and other:8080");
    assert.deepEqual(
      ["http://127.0.0.1:50060/v1", "http://[::1]:1/v1", "http://localhost/v1", "https://api.openai.com/v1"].map(
        alwaysDirect,
      ),
      [true, true, true, false],
    );
  });
});

test("proxyFor, the guarded requests' choice, reads NO_PROXY as undici's EnvHttpProxyAgent does", () => {
  const H = "http://proxy:3128";
  const S = "http://tls-proxy:3128";
  const cases: [string, Parameters<typeof proxyFor>[0], string | undefined][] = [
    ["https://example.com/", { httpsProxy: S, httpProxy: H }, S],
    ["https://example.com/", { httpProxy: H }, H], // HTTP_PROXY carries https:// when HTTPS_PROXY is unset
    ["http://example.com/", { httpsProxy: S }, undefined],
    ["http://example.com/", { httpProxy: H }, H],
    ["http://localhost:8080/", { httpProxy: H }, undefined],
    ["http://[::1]/", { httpProxy: H }, undefined],
    ["http://example.com/", { httpProxy: H, noProxy: "example.com" }, undefined],
    ["http://www.example.com/", { httpProxy: H, noProxy: "example.com" }, undefined],
    ["http://example.com/", { httpProxy: H, noProxy: ".example.com" }, undefined],
    ["http://example.com/", { httpProxy: H, noProxy: "*.example.com" }, H], // subdomains only
    ["http://a.example.com/", { httpProxy: H, noProxy: "*.example.com" }, undefined],
    ["http://notexample.com/", { httpProxy: H, noProxy: "example.com" }, H],
    ["http://example.com:8080/", { httpProxy: H, noProxy: "example.com:80" }, H],
    ["http://example.com/", { httpProxy: H, noProxy: "other.org example.com:80" }, undefined],
    ["http://EXAMPLE.com./", { httpProxy: H, noProxy: "Example.COM" }, undefined],
    ["http://anything.net/", { httpProxy: H, noProxy: "x.org,*" }, undefined],
    ["http://[2001:db8::1]:8080/", { httpProxy: H, noProxy: "[2001:db8::1]:8080" }, undefined],
    ["http://[2001:db8::1]/", { httpProxy: H, noProxy: "2001:db8::1" }, undefined],
    ["http://example.com/", undefined, undefined],
  ];
  for (const [url, proxy, want] of cases)
    assert.equal(proxyFor(proxy, new URL(url)), want, `${url} ${JSON.stringify(proxy)}`);
});
