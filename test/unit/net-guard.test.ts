// The SSRF guard and the web tools, in-process against real sockets on this machine: a "public"
// HTTP server on 127.0.0.2 (the only address the test policy treats as public) and a sentinel on
// every other loopback address that counts connections and would answer with a secret. Host
// names resolve through a table in the test, so nothing leaves the machine. The hostile URLs
// follow the OWASP SSRF prevention cheat sheet and OpenClaw's ssrf tests: other spellings of
// loopback, private and metadata addresses, IPv6 dressings of IPv4, userinfo tricks, other
// schemes, names that resolve inward, and redirect chains that end inward.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createServer as createHttpServer, type Server } from "node:http";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import { createSecureContext } from "node:tls";
import { readFileSync } from "node:fs";
import { createServer as createTcpServer, type AddressInfo } from "node:net";
import { writeFile, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { selfSigned } from "../helpers/certs.js";
import { HttpProxy } from "../helpers/http-proxy.js";
import { guardedRequest, NetRefusal, type NetPolicy } from "../../services/shared/net/net-guard.js";
import { DEFAULT_AGENT, type AgentConfig } from "../../services/runner/agent-config.js";
import { httpRequestTool, Secrets, webFetchTool } from "../../services/runner/tools/web-tools.js";
import type { ToolContext } from "../../services/runner/tools/tools.js";

const SECRET_PAGE = "SENTINEL-PRIVATE-BYTES";
let sentinelHits = 0;
let S = 0; // the sentinel's port, on every local address
let P = 0; // the public server's port, on 127.0.0.2
let T = 0; // an HTTPS server's port, on 127.0.0.2, with a self-signed certificate
let tlsServer: HttpsServer;
const sniSeen: string[] = [];
const sentinel = createTcpServer((sock) => {
  sentinelHits++;
  sock.end(
    `HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: ${SECRET_PAGE.length}\r\n\r\n${SECRET_PAGE}`,
  );
});
let publicServer: Server;
let resolves: string[] = [];
let rebindCalls = 0;

const names: Record<string, string[]> = {
  "public.test": ["127.0.0.2"],
  "metadata.test": ["169.254.169.254"],
  "inward.test": ["127.0.0.1"],
  "v6loop.test": ["::1"],
  "mapped.test": ["::ffff:169.254.169.254"],
  "mixed.test": ["127.0.0.2", "10.1.2.3"],
  "private.test": ["192.168.0.10"],
  "ula.test": ["fd00:ec2::254"],
};

const policy = (): NetPolicy => ({
  ports: [80, 443, S, P, T],
  allow: ["127.0.0.2/32"],
  maxRedirects: 3,
  async resolve(host) {
    resolves.push(host);
    if (host === "rebind.test") return [{ address: rebindCalls++ === 0 ? "127.0.0.2" : "127.0.0.1", family: 4 }];
    const a = names[host];
    if (!a) throw Object.assign(new Error("not found"), { code: "ENOTFOUND" });
    return a.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }));
  },
});

before(async () => {
  await new Promise<void>((r) => sentinel.listen(0, "::", r));
  S = (sentinel.address() as AddressInfo).port;
  publicServer = createHttpServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://x");
    const to = url.searchParams.get("to");
    if (url.pathname === "/redirect" && to) return void res.writeHead(302, { location: to }).end();
    if (url.pathname === "/loop") return void res.writeHead(302, { location: "/loop" }).end();
    if (url.pathname === "/hop") return void res.writeHead(301, { location: "/page" }).end();
    if (url.pathname === "/page")
      return void res
        .writeHead(200, { "content-type": "text/html; charset=utf-8" })
        .end(
          "<html><head><title>T</title><script>var leaked = 'SCRIPT-TEXT';</script><style>p{color:red}</style></head>" +
            "<body><h1>Troupe test page</h1><p>Readable <b>text</b> here.</p><ul><li>one</li><li>two</li></ul>" +
            `<a href="/other">a link</a><img src="x.png" alt="IMG-ALT"></body></html>`,
        );
    if (url.pathname === "/long")
      return void res.writeHead(200, { "content-type": "text/plain" }).end("word ".repeat(20_000));
    if (url.pathname === "/huge") {
      res.writeHead(200, { "content-type": "text/plain" });
      const chunk = "x".repeat(64 * 1024);
      let sent = 0;
      const pump = () => {
        while (sent < 8 * 1024 * 1024 && res.write(chunk)) sent += chunk.length;
        if (sent >= 8 * 1024 * 1024) res.end();
        else res.once("drain", pump);
      };
      res.on("error", () => undefined);
      return void pump();
    }
    if (url.pathname === "/png") return void res.writeHead(200, { "content-type": "image/png" }).end(Buffer.alloc(64));
    if (url.pathname === "/stall") return; // never answers
    if (url.pathname === "/echo")
      return void res.writeHead(200, { "content-type": "application/json" }).end(
        JSON.stringify({
          method: req.method,
          host: req.headers.host,
          authorization: req.headers.authorization ?? null,
        }),
      );
    if (url.pathname === "/missing")
      return void res.writeHead(404, { "content-type": "text/plain" }).end("no such page");
    res.writeHead(200, { "content-type": "text/plain" }).end(`public ${req.headers.host}`);
  });
  await new Promise<void>((r) => publicServer.listen(0, "127.0.0.2", r));
  P = (publicServer.address() as AddressInfo).port;
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-tls-"));
  const files = selfSigned(dir, "public", "public.test");
  const tls = { key: readFileSync(files.key), cert: readFileSync(files.cert) };
  await rm(dir, { recursive: true, force: true });
  tlsServer = createHttpsServer(
    { ...tls, SNICallback: (name, cb) => (sniSeen.push(name), cb(null, createSecureContext(tls))) },
    (_req, res) => res.end("over tls"),
  );
  await new Promise<void>((r) => tlsServer.listen(0, "127.0.0.2", r));
  T = (tlsServer.address() as AddressInfo).port;
});

after(() => {
  tlsServer.close();
  sentinel.close();
  publicServer.closeAllConnections();
  publicServer.close();
});

const pub = (p: string) => `http://127.0.0.2:${P}${p}`;
const via = (target: string) => pub(`/redirect?to=${encodeURIComponent(target)}`);

/** [URL, what the refusal must say]; $S is the sentinel's port. */
const HOSTILE: [string, RegExp][] = [
  // Loopback in every spelling the URL parser accepts.
  ["http://127.0.0.1:$S/", /127\.0\.0\.1 is not a public address/],
  ["http://127.1:$S/", /not a public address/],
  ["http://127.0.1:$S/", /not a public address/],
  ["http://2130706433:$S/", /127\.0\.0\.1/],
  ["http://0x7f000001:$S/", /127\.0\.0\.1/],
  ["http://017700000001:$S/", /127\.0\.0\.1/],
  ["http://0177.0.0.1:$S/", /127\.0\.0\.1/],
  ["http://0x7f.0x0.0x0.0x1:$S/", /127\.0\.0\.1/],
  ["http://127.0.0.1.:$S/", /not a public address/],
  ["http://127.000.000.001:$S/", /not a public address|not a URL/],
  ["http://0:$S/", /0\.0\.0\.0 is not a public/],
  ["http://0.0.0.0:$S/", /not a public address/],
  ["http://[::1]:$S/", /: ::1 is not a public address/],
  ["http://[::]:$S/", /not a public address/],
  ["http://[0:0:0:0:0:0:0:1]:$S/", /not a public address/],
  ["http://[::ffff:127.0.0.1]:$S/", /not a public address/],
  ["http://[::ffff:7f00:1]:$S/", /not a public address/],
  ["http://[0:0:0:0:0:ffff:127.0.0.1]:$S/", /not a public address/],
  ["http://[::127.0.0.1]:$S/", /not a public address/],
  ["http://[64:ff9b::127.0.0.1]:$S/", /not a public address/],
  ["http://[2002:7f00:1::]:$S/", /not a public address/],
  ["http://[2001:0:7f00:1::]:$S/", /not a public address/],
  ["http://localhost:$S/", /names this machine/],
  ["http://LOCALHOST.:$S/", /names this machine/],
  ["http://api.localhost:$S/", /names this machine/],
  // Private, shared, link-local and metadata addresses.
  ["http://169.254.169.254/latest/meta-data/", /169\.254\.169\.254 is not a public/],
  ["http://2852039166/latest/meta-data/", /169\.254\.169\.254/],
  ["http://[::ffff:a9fe:a9fe]/", /not a public address/],
  ["http://[fd00:ec2::254]/", /not a public address/],
  ["http://metadata.google.internal/computeMetadata/v1/", /metadata service/],
  ["http://100.100.100.200/latest/meta-data/", /not a public address/],
  ["http://10.0.0.1/", /not a public address/],
  ["http://172.16.0.1/", /not a public address/],
  ["http://172.31.255.255/", /not a public address/],
  ["http://192.168.1.1/", /not a public address/],
  ["http://100.64.0.1/", /not a public address/],
  ["http://198.18.0.1/", /not a public address/],
  ["http://192.0.0.170/", /not a public address/],
  ["http://224.0.0.1/", /not a public address/],
  ["http://255.255.255.255/", /not a public address/],
  ["http://240.0.0.1/", /not a public address/],
  ["http://[fe80::1]/", /not a public address/],
  ["http://[fc00::1]/", /not a public address/],
  ["http://[ff02::1]/", /not a public address/],
  // Userinfo, schemes, ports.
  ["http://user:pass@127.0.0.2:$P/", /credentials/],
  ["http://127.0.0.2:$P@127.0.0.1:$S/", /credentials/],
  ["http://public.test@127.0.0.1:$S/", /credentials/],
  ["http://127.0.0.1:$S#@127.0.0.2:$P/", /127\.0\.0\.1 is not a public/],
  ["http://127.0.0.1:$S\\@127.0.0.2:$P/", /credentials|not a public/],
  ["file:///etc/passwd", /only http and https/],
  ["gopher://127.0.0.1:$S/_GET", /only http and https/],
  ["ftp://127.0.0.2/", /only http and https/],
  ["dict://127.0.0.1:$S/info", /only http and https/],
  ["data:text/plain,hello", /only http and https/],
  ["javascript:alert(1)", /only http and https/],
  ["http://127.0.0.2:22/", /port 22 is not allowed/],
  ["https://127.0.0.2:6379/", /port 6379 is not allowed/],
  ["not a url", /is not a URL/],
  ["http://", /is not a URL|no host/],
  // Names that resolve inward: every address is checked, and the connection uses the checked one.
  ["http://metadata.test/", /resolves to 169\.254\.169\.254/],
  ["http://inward.test:$S/", /resolves to 127\.0\.0\.1/],
  ["http://v6loop.test:$S/", /resolves to ::1/],
  ["http://mapped.test/", /resolves to ::ffff:169\.254\.169\.254/],
  ["http://mixed.test:$P/", /resolves to 10\.1\.2\.3/],
  ["http://private.test/", /resolves to 192\.168\.0\.10/],
  ["http://ula.test/", /resolves to fd00:ec2::254/],
  ["http://nowhere.test/", /does not resolve/],
  // Redirect chains: each hop is checked as the first was.
  ["REDIRECT http://127.0.0.1:$S/", /127\.0\.0\.1 is not a public/],
  ["REDIRECT http://[::ffff:127.0.0.1]:$S/", /not a public address/],
  ["REDIRECT http://169.254.169.254/latest/meta-data/iam/", /not a public address/],
  ["REDIRECT http://metadata.test/", /resolves to 169\.254/],
  ["REDIRECT http://localhost:$S/", /names this machine/],
  ["REDIRECT file:///etc/passwd", /only http and https/],
  ["REDIRECT http://127.0.0.2:25/", /port 25 is not allowed/],
  ["REDIRECT2 http://127.0.0.1:$S/", /127\.0\.0\.1 is not a public/],
  ["LOOP", /more than 3 redirects/],
];

const expand = (u: string) => {
  const filled = u.replaceAll("$S", String(S)).replaceAll("$P", String(P));
  if (filled === "LOOP") return pub("/loop");
  if (filled.startsWith("REDIRECT2 ")) return via(via(filled.slice(10)));
  if (filled.startsWith("REDIRECT ")) return via(filled.slice(9));
  return filled;
};

const ctx = (): ToolContext => ({
  sessionId: "s",
  agentId: "a",
  toolCallId: "c",
  signal: new AbortController().signal,
  onUpdate() {},
});
const agent =
  (over: Partial<AgentConfig> = {}) =>
  async (): Promise<AgentConfig> => ({ name: "a", ...DEFAULT_AGENT, ...over });

describe("the SSRF guard", () => {
  test(`refuses ${HOSTILE.length} hostile URLs and redirect chains, saying why, and sends nothing inward`, async () => {
    assert.ok(HOSTILE.length >= 40);
    for (const [raw, why] of HOSTILE) {
      const url = expand(raw);
      await assert.rejects(guardedRequest(url, { maxBytes: 1000, timeoutMs: 5000 }, policy()), (err: Error) => {
        assert.ok(err instanceof NetRefusal, `${raw}: ${err.message} is not a refusal`);
        assert.match(err.message, why, raw);
        return true;
      });
    }
    assert.equal(sentinelHits, 0, "no connection reached a refused address");
  });

  test("through web_fetch the refusals are tool errors and no refused byte reaches the model", async () => {
    const tool = webFetchTool(policy(), agent());
    for (const [raw] of HOSTILE) {
      const r = await tool.execute({ url: expand(raw) }, ctx());
      assert.equal(r.isError, true, raw);
      assert.match(r.output, /^web_fetch refused: /, raw);
      assert.ok(!r.output.includes(SECRET_PAGE), raw);
    }
    assert.equal(sentinelHits, 0);
  });

  test("a name is resolved once and the connection goes to the address checked (no rebinding)", async () => {
    resolves = [];
    rebindCalls = 0;
    const res = await guardedRequest(`http://rebind.test:${P}/`, { maxBytes: 1000, timeoutMs: 5000 }, policy());
    assert.equal(res.body.toString(), `public rebind.test:${P}`);
    assert.deepEqual(resolves, ["rebind.test"]);
    // The name now resolves inward: refused before any connection.
    await assert.rejects(
      guardedRequest(`http://rebind.test:${S}/`, { maxBytes: 1000, timeoutMs: 5000 }, policy()),
      /resolves to 127\.0\.0\.1/,
    );
    assert.equal(sentinelHits, 0);
  });

  test("https goes to the checked address under the URL's name, and the certificate is checked", async () => {
    const r = await webFetchTool(policy(), agent()).execute({ url: `https://public.test:${T}/` }, ctx());
    assert.equal(r.isError, true);
    assert.match(r.output, /^web_fetch failed: self[- ]signed certificate/);
    assert.deepEqual(sniSeen, ["public.test"], "the handshake reached the pinned address, named as in the URL");
  });

  test("caps: body bytes, whole-request time, and the caller's abort", async () => {
    const big = await guardedRequest(pub("/huge"), { maxBytes: 100_000, timeoutMs: 5000 }, policy());
    assert.equal(big.body.length, 100_000);
    assert.equal(big.truncated, true);
    await assert.rejects(
      guardedRequest(pub("/stall"), { maxBytes: 1000, timeoutMs: 300 }, policy()),
      /no complete answer within 300 ms/,
    );
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 100);
    await assert.rejects(
      guardedRequest(pub("/stall"), { maxBytes: 1000, timeoutMs: 5000, signal: abort.signal }, policy()),
      (err: Error) => !(err instanceof NetRefusal),
    );
  });
});

describe("web_fetch", () => {
  test("returns the readable text of an allowed page with its final URL, status and cut", async () => {
    const r = await webFetchTool(policy(), agent()).execute({ url: pub("/hop") }, ctx());
    assert.equal(r.isError, false, r.output);
    assert.match(
      r.output,
      new RegExp(`^URL: http://127\\.0\\.0\\.2:${P}/page\nStatus: 200\nContent-Type: text/html\n`),
    );
    assert.match(r.output, /Redirected from: .*\/hop/);
    assert.match(r.output, /Truncated: no/);
    assert.match(r.output, /Troupe test page/);
    assert.match(r.output, /Readable text here\./);
    assert.match(r.output, /\* one\n \* two|one[\s\S]*two/);
    assert.ok(!r.output.includes("SCRIPT-TEXT") && !r.output.includes("color:red") && !r.output.includes("IMG-ALT"));
    const long = await webFetchTool(policy(), agent()).execute({ url: pub("/long"), max_chars: 500 }, ctx());
    assert.match(long.output, /Truncated: yes \(100000 characters; the first 500 are shown\)/);
    assert.equal(long.output.split("\n\n")[1].length, 500);
  });

  test("refuses what is not text, reports HTTP errors, and can be turned off per agent", async () => {
    const png = await webFetchTool(policy(), agent()).execute({ url: pub("/png") }, ctx());
    assert.equal(png.isError, true);
    assert.match(png.output, /reads text and HTML only; this is image\/png/);
    const missing = await webFetchTool(policy(), agent()).execute({ url: pub("/missing") }, ctx());
    assert.equal(missing.isError, true);
    assert.match(missing.output, /Status: 404[\s\S]*no such page/);
    const off = await webFetchTool(policy(), agent({ webFetch: false })).execute({ url: pub("/page") }, ctx());
    assert.match(off.output, /turned off for this agent/);
    const bad = await webFetchTool(policy(), agent()).execute({ url: 42 }, ctx());
    assert.match(bad.output, /`url` must be an http\(s\) URL/);
  });
});

describe("http_request", () => {
  let dir = "";
  let secrets: Secrets;
  const TOKEN = "tok-3f9a1c77e2";
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "troupe-secrets-"));
    await writeFile(path.join(dir, "secrets.json"), JSON.stringify({ API_TOKEN: TOKEN, OTHER: "other-secret-value" }));
    secrets = new Secrets(path.join(dir, "secrets.json"));
  });
  after(() => rm(dir, { recursive: true, force: true }));
  const http = (allowHosts: string[], secretsFor: Record<string, string[]> = {}) =>
    agent({ http: { allowHosts, secrets: secretsFor } });

  test("sends a secret only to its host, and the model never sees it even when echoed", async () => {
    const tool = httpRequestTool(policy(), http(["public.test"], { API_TOKEN: ["public.test"] }), secrets);
    const r = await tool.execute(
      {
        method: "POST",
        url: `http://public.test:${P}/echo`,
        headers: { authorization: "Bearer {{secret:API_TOKEN}}" },
        json: { a: 1 },
      },
      ctx(),
    );
    assert.equal(r.isError, false, r.output);
    assert.match(r.output, /^HTTP 200\ncontent-type: application\/json\n/);
    assert.match(r.output, /"authorization":"Bearer \[secret API_TOKEN\]"/);
    assert.match(r.output, /"method":"POST"/);
    assert.ok(!r.output.includes(TOKEN));
  });

  test("hosts, secrets and headers outside the agent's configuration are refused", async () => {
    const none = await httpRequestTool(policy(), http([]), secrets).execute(
      { method: "GET", url: pub("/echo") },
      ctx(),
    );
    assert.match(none.output, /may not call any host/);
    const tool = httpRequestTool(policy(), http(["public.test"], { API_TOKEN: ["other.example"] }), secrets);
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ method: "GET", url: pub("/echo") }, /127\.0\.0\.2 is not among this agent's allowed hosts/],
      [
        { method: "GET", url: `http://public.test:${P}/echo`, headers: { authorization: "{{secret:API_TOKEN}}" } },
        /secret API_TOKEN may not be sent to public\.test/,
      ],
      [
        { method: "GET", url: `http://public.test:${P}/echo`, headers: { "x-k": "{{secret:NOPE}}" } },
        /secret NOPE may not be sent/,
      ],
      [
        { method: "GET", url: `http://public.test:${P}/echo`, headers: { host: "evil" } },
        /header host is set by the runtime/,
      ],
      [
        { method: "GET", url: `http://public.test:${P}/redirect?to=${encodeURIComponent(pub("/echo"))}` },
        /127\.0\.0\.2 is not among/,
      ],
      [{ method: "TRACE", url: `http://public.test:${P}/` }, /method must be one of/],
      [{ method: "POST", url: `http://public.test:${P}/`, json: {}, body: "x" }, /not both/],
      [{ method: "GET", url: `http://inward.test:${S}/` }, /refused: inward\.test resolves to 127\.0\.0\.1/],
    ];
    for (const [args, why] of cases) {
      const r = await tool.execute(args, ctx());
      assert.equal(r.isError, true, JSON.stringify(args));
      assert.match(r.output, why, JSON.stringify(args));
    }
    assert.equal(sentinelHits, 0);
  });
});

describe("the SSRF guard behind an HTTP proxy", () => {
  // The proxy as RFC 9110 describes one (helpers/http-proxy.ts), on 127.0.0.1: reaching it is the
  // operator's choice, not the guard's. What it is asked to carry is what the guard checked.
  const behind = (proxy: HttpProxy, over: Partial<NetPolicy["proxy"]> = {}): NetPolicy => ({
    ...policy(),
    proxy: { httpProxy: proxy.url, httpsProxy: proxy.url, ...over },
  });

  test("a request is tunnelled to the address the guard checked, never to the name", async () => {
    const proxy = await new HttpProxy().start();
    try {
      const res = await guardedRequest(`http://public.test:${P}/`, { maxBytes: 1000, timeoutMs: 5000 }, behind(proxy));
      assert.equal(res.body.toString(), `public public.test:${P}`, "the site is asked for by its name");
      // A redirect's next hop is checked and tunnelled the same way.
      await guardedRequest(`http://public.test:${P}/hop`, { maxBytes: 1000, timeoutMs: 5000 }, behind(proxy));
      assert.deepEqual(proxy.seen, [
        { method: "CONNECT", target: `127.0.0.2:${P}` },
        { method: "CONNECT", target: `127.0.0.2:${P}` },
        { method: "CONNECT", target: `127.0.0.2:${P}` },
      ]);
    } finally {
      await proxy.close();
    }
  });

  test(`the ${HOSTILE.length} hostile URLs are refused before the proxy is asked for anything`, async () => {
    const proxy = await new HttpProxy().start();
    try {
      for (const [raw, why] of HOSTILE) {
        const url = expand(raw);
        await assert.rejects(guardedRequest(url, { maxBytes: 1000, timeoutMs: 5000 }, behind(proxy)), why, raw);
      }
      // Redirect chains asked the proxy for their first, public hop only.
      assert.ok(
        proxy.seen.every((s) => s.target === `127.0.0.2:${P}`),
        JSON.stringify(proxy.seen),
      );
      assert.equal(sentinelHits, 0);
    } finally {
      await proxy.close();
    }
  });

  test("https inside the tunnel is named for the site, and its certificate is still checked", async () => {
    const proxy = await new HttpProxy().start();
    try {
      const r = await webFetchTool(behind(proxy), agent()).execute({ url: `https://public.test:${T}/` }, ctx());
      assert.equal(r.isError, true);
      assert.match(r.output, /^web_fetch failed: self[- ]signed certificate/);
      assert.equal(sniSeen.at(-1), "public.test");
      assert.deepEqual(proxy.seen, [{ method: "CONNECT", target: `127.0.0.2:${T}` }]);
    } finally {
      await proxy.close();
    }
  });

  test("a proxy's refusal says so (407: credentials), and credentials in its URL are sent", async () => {
    const proxy = await new HttpProxy("agent:s3cret").start();
    try {
      await assert.rejects(
        guardedRequest(`http://public.test:${P}/`, { maxBytes: 1000, timeoutMs: 5000 }, behind(proxy)),
        (err: Error) => {
          assert.ok(err instanceof NetRefusal, err.message);
          assert.match(err.message, /proxy at 127\.0\.0\.1:\d+ refused a tunnel to public\.test:\d+ \(HTTP 407/);
          assert.ok(!err.message.includes("s3cret"));
          return true;
        },
      );
      const withCredentials = proxy.url.replace("http://", "http://agent:s3cret@");
      const res = await guardedRequest(
        `http://public.test:${P}/`,
        { maxBytes: 1000, timeoutMs: 5000 },
        behind(proxy, { httpProxy: withCredentials }),
      );
      assert.equal(res.status, 200);
    } finally {
      await proxy.close();
    }
  });

  test("a host NO_PROXY names, and HTTPS_PROXY alone for an http:// URL, go directly", async () => {
    const proxy = await new HttpProxy().start();
    try {
      const url = `http://public.test:${P}/`;
      const direct = [
        behind(proxy, { noProxy: "example.com, .test" }),
        behind(proxy, { noProxy: `public.test:${P}` }),
        { ...policy(), proxy: { httpsProxy: proxy.url } },
      ];
      for (const p of direct)
        assert.equal((await guardedRequest(url, { maxBytes: 1000, timeoutMs: 5000 }, p)).status, 200);
      assert.deepEqual(proxy.seen, []);
      // A NO_PROXY entry for another port does not count.
      await guardedRequest(url, { maxBytes: 1000, timeoutMs: 5000 }, behind(proxy, { noProxy: "public.test:1" }));
      assert.equal(proxy.seen.length, 1);
    } finally {
      await proxy.close();
    }
  });
});
