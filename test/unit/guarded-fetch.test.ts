// The guarded fetch the MCP client uses: each hop checked by the SSRF guard, a credential kept to
// its origin across redirects, the body streamed but cut past its cap, the headers due in time.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { guardedFetch } from "../../services/shared/net/guarded-fetch.js";

const HOST = "127.0.0.2";
const seen: string[] = [];
let a: Server;
let b: Server;
let portA = 0;
let portB = 0;

const listen = async (s: Server) => {
  await new Promise<void>((r) => s.listen(0, HOST, r));
  return (s.address() as AddressInfo).port;
};

before(async () => {
  b = createServer((req, res) => {
    seen.push(`b ${req.url} ${req.headers.authorization ?? "-"}`);
    res.end("at b");
  });
  a = createServer((req, res) => {
    seen.push(`a ${req.url} ${req.headers.authorization ?? "-"}`);
    if (req.url === "/away") return void res.writeHead(307, { location: `http://${HOST}:${portB}/landed` }).end();
    if (req.url === "/home") return void res.writeHead(307, { location: "/here" }).end();
    if (req.url === "/loopback") return void res.writeHead(307, { location: `http://127.0.0.1:${portB}/` }).end();
    if (req.url === "/big") return void res.end("x".repeat(64 * 1024));
    if (req.url === "/slow") return void setTimeout(() => res.end("late"), 2000);
    res.end(`at a ${req.url}`);
  });
  portA = await listen(a);
  portB = await listen(b);
});

after(() => {
  for (const s of [a, b]) {
    s.closeAllConnections();
    s.close();
  }
});

describe("guardedFetch", () => {
  const policy = () => ({ ports: [portA, portB], allow: [`${HOST}/32`], maxRedirects: 3 });
  const fetchFor = (maxBytes = 1 << 20, headersTimeoutMs = 5000) =>
    guardedFetch(policy(), {
      headers: (url): Record<string, string> =>
        url.origin === `http://${HOST}:${portA}` ? { authorization: "Bearer k" } : {},
      maxBytes,
      headersTimeoutMs,
    });

  test("a credential goes to its origin, never where a redirect leads", async () => {
    seen.length = 0;
    const res = await fetchFor()(`http://${HOST}:${portA}/away`);
    assert.equal(await res.text(), "at b");
    assert.deepEqual(seen, ["a /away Bearer k", "b /landed -"]);
    seen.length = 0;
    assert.equal(await (await fetchFor()(`http://${HOST}:${portA}/home`)).text(), "at a /here");
    assert.deepEqual(seen, ["a /home Bearer k", "a /here Bearer k"]);
  });

  test("a redirect to a private address is refused before anything is sent there", async () => {
    await assert.rejects(fetchFor()(`http://${HOST}:${portA}/loopback`), /127\.0\.0\.1 is not a public address/);
    await assert.rejects(fetchFor()(`http://127.0.0.1:${portA}/`), /not a public address/);
  });

  test("a body past its cap errors as it streams; headers late are refused", async () => {
    const res = await fetchFor(16 * 1024)(`http://${HOST}:${portA}/big`);
    await assert.rejects(res.text(), /passed 16384 bytes/);
    await assert.rejects(fetchFor(1 << 20, 300)(`http://${HOST}:${portA}/slow`), /no answer from .* within 300 ms/);
  });
});
