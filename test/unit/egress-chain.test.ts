// The sandbox's egress proxy where the deployment's only way out is an HTTP proxy: what a command
// sends leaves through a CONNECT tunnel to the address the guard checked. In-process on real
// sockets: each connection to a local port is served by EgressProxy as the sandbox service serves
// a command's (test/sandbox-egress.test.ts covers the path from inside a container); the upstream
// proxy is the RFC 9110 one of helpers/http-proxy.ts, the sites are on 127.0.0.2 (the policy's
// "public" address) and a sentinel on 127.0.0.3 counts what reaches it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer as createHttpServer, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { connect, createServer, type AddressInfo, type Server as TcpServer } from "node:net";
import { getCACertificates, setDefaultCACertificates } from "node:tls";
import os from "node:os";
import path from "node:path";
import { EgressProxy, type EgressState } from "../../services/sandbox/egress-proxy.js";
import { DEFAULT_NET_POLICY } from "../../services/shared/net/net-guard.js";
import { createLogger } from "../../services/shared/process/log.js";
import type { OutboundProxy } from "../../services/shared/net/outbound-proxy.js";
import { selfSigned } from "../helpers/certs.js";
import { HttpProxy } from "../helpers/http-proxy.js";
import { waitFor } from "../helpers/stack.js";

let site: Server;
let secure: Server;
/** An https site whose certificate this process trusts, as NODE_EXTRA_CA_CERTS makes the service trust one. */
let trusted: Server;
/** The key and certificate of an https:// deployment proxy on 127.0.0.1, also trusted. */
let proxyTls: { key: Buffer; cert: Buffer };
let echo: TcpServer;
let sentinel: TcpServer;
let sentinelHits = 0;
let dir = "";
const port = (s: Server | TcpServer) => (s.address() as AddressInfo).port;
const listen = (s: Server | TcpServer, host: string) => new Promise<void>((r) => s.listen(0, host, r));

before(async () => {
  site = createHttpServer((req, res) => res.end(`site: ${req.method} ${req.url} for ${req.headers.host}`));
  echo = createServer((socket) => socket.on("data", (d) => socket.write(d.toString("utf8").toUpperCase())));
  sentinel = createServer((socket) => (sentinelHits++, socket.destroy()));
  dir = mkdtempSync(path.join(os.tmpdir(), "troupe-chain-"));
  const cert = selfSigned(dir, "site", "127.0.0.2", "IP:127.0.0.2");
  secure = createHttpsServer({ cert: readFileSync(cert.cert), key: readFileSync(cert.key) }, (_q, res) =>
    res.end("tls"),
  );
  const trustedCert = selfSigned(dir, "trusted", "127.0.0.2", "IP:127.0.0.2");
  const proxyCert = selfSigned(dir, "proxy", "127.0.0.1", "IP:127.0.0.1");
  proxyTls = { key: readFileSync(proxyCert.key), cert: readFileSync(proxyCert.cert) };
  // This file runs in a process of its own (node --test), so widening its trust touches no other test.
  setDefaultCACertificates([
    ...getCACertificates("default"),
    readFileSync(trustedCert.cert, "utf8"),
    readFileSync(proxyCert.cert, "utf8"),
  ]);
  trusted = createHttpsServer(
    { cert: readFileSync(trustedCert.cert), key: readFileSync(trustedCert.key) },
    (req, res) => res.end(`tls: ${req.url}`),
  );
  await Promise.all([
    listen(trusted, "127.0.0.2"),
    listen(site, "127.0.0.2"),
    listen(echo, "127.0.0.2"),
    listen(secure, "127.0.0.2"),
    listen(sentinel, "127.0.0.3"),
  ]);
});

after(() => {
  for (const s of [site, secure, trusted]) s.closeAllConnections();
  for (const s of [site, secure, trusted, echo, sentinel]) s.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A local port whose every connection EgressProxy serves, as a sandbox granted `hosts`. */
async function egressPort(proxy: OutboundProxy | undefined, hosts = ["127.0.0.2", "127.0.0.3"]) {
  const egress = new EgressProxy(
    {
      ...DEFAULT_NET_POLICY,
      ports: [port(site), port(secure), port(trusted), port(echo), port(sentinel)],
      allow: ["127.0.0.2/32"],
      proxy,
    },
    createLogger("sandbox", "error"),
  );
  const state: EgressState = { hosts, budgetBytes: 1 << 20, usedBytes: 0 };
  // Half-open as a command's connection through the agent is: its end of sending is not the end of reading.
  const server = createServer({ allowHalfOpen: true }, (socket) => egress.serve(socket, "tenant/session", state));
  await listen(server, "127.0.0.1");
  return server;
}

/**
 * Sends `request` to the egress port and returns everything it answers, once it closes.
 * `afterHead`: sent once the answer's head is in, the sending side shut 200 ms later.
 * `halfClose`: the sending side is shut with the request, as busybox wget does.
 */
function ask(
  server: TcpServer,
  request: string,
  how: { afterHead?: string; halfClose?: boolean } = {},
): Promise<string> {
  let pending = how.afterHead;
  return new Promise((resolve, reject) => {
    const socket = connect(port(server), "127.0.0.1", () =>
      how.halfClose ? socket.end(request) : socket.write(request),
    );
    let text = "";
    socket.on("data", (d) => {
      text += d.toString("utf8");
      if (pending && text.includes("\r\n\r\n")) {
        socket.write(pending);
        pending = undefined;
        setTimeout(() => socket.end(), 200);
      }
    });
    socket.on("error", reject);
    socket.on("close", () => resolve(text));
  });
}

describe("sandbox egress chained through the deployment's proxy", () => {
  test("a plain request and a CONNECT tunnel leave through the proxy, to the checked address", async () => {
    const upstream = await new HttpProxy().start();
    const server = await egressPort({ httpProxy: upstream.url, httpsProxy: upstream.url });
    try {
      const siteAt = `127.0.0.2:${port(site)}`;
      const plain = await ask(server, `GET http://${siteAt}/page HTTP/1.1\r\nHost: ${siteAt}\r\n\r\n`);
      assert.match(plain, /^HTTP\/1\.1 200 [\s\S]*site: GET \/page for 127\.0\.0\.2:\d+$/);
      const echoAt = `127.0.0.2:${port(echo)}`;
      const tunnelled = await ask(server, `CONNECT ${echoAt} HTTP/1.1\r\nHost: ${echoAt}\r\n\r\n`, {
        afterHead: "shout",
      });
      assert.match(tunnelled, /^HTTP\/1\.1 200 Connection established\r\n\r\nSHOUT$/);
      assert.deepEqual(upstream.seen, [
        { method: "CONNECT", target: siteAt },
        { method: "CONNECT", target: echoAt },
      ]);
    } finally {
      server.close();
      await upstream.close();
    }
  });

  test("a command that half-closes after its request gets the answer through a plain proxy", async () => {
    // busybox wget shuts its sending side once the request is out; a plain request passes that on.
    const upstream = await new HttpProxy().start();
    const server = await egressPort({ httpProxy: upstream.url });
    try {
      const at = `127.0.0.2:${port(site)}`;
      const answer = await ask(server, `GET http://${at}/half HTTP/1.1\r\nHost: ${at}\r\n\r\n`, { halfClose: true });
      assert.match(answer, /^HTTP\/1\.1 200 [\s\S]*site: GET \/half for 127\.0\.0\.2:\d+$/);
    } finally {
      server.close();
      await upstream.close();
    }
  });

  test("https in absolute form, half-closed, through an https:// proxy: the answer comes, no tunnel stays", async () => {
    // The TLS connection is this side's, so the command's half-close is not the server's business:
    // passed on, it ended the TLS session to the site and the one to the proxy, which dropped the
    // tunnel before the answer (stop 61's flaky sandbox-egress test; 100% lost here).
    const upstream = await new HttpProxy(undefined, proxyTls).start();
    const server = await egressPort({ httpsProxy: upstream.url });
    try {
      const at = `127.0.0.2:${port(trusted)}`;
      for (let i = 0; i < 5; i++) {
        const answer = await ask(server, `GET https://${at}/n${i} HTTP/1.1\r\nHost: ${at}\r\n\r\n`, {
          halfClose: true,
        });
        assert.match(answer, new RegExp(`^HTTP/1\\.1 200 [\\s\\S]*tls: /n${i}$`));
      }
      assert.equal(upstream.seen.length, 5);
      await waitFor("every tunnel through the proxy closed", async () => upstream.openTunnels === 0, 5000);
    } finally {
      server.close();
      await upstream.close();
    }
  });

  test("https in absolute form, directly, half-closed: the answer comes", async () => {
    const server = await egressPort(undefined);
    try {
      const at = `127.0.0.2:${port(trusted)}`;
      const answer = await ask(server, `GET https://${at}/direct HTTP/1.1\r\nHost: ${at}\r\n\r\n`, { halfClose: true });
      assert.match(answer, /^HTTP\/1\.1 200 [\s\S]*tls: \/direct$/);
    } finally {
      server.close();
    }
  });

  test("https in absolute form: TLS inside the tunnel, the certificate still checked", async () => {
    const upstream = await new HttpProxy().start();
    const server = await egressPort({ httpsProxy: upstream.url });
    try {
      const at = `127.0.0.2:${port(secure)}`;
      // The test's certificate is its own, not in the service's trust: refused after the tunnel
      // opened, which is the check being made inside it.
      const r = await ask(server, `GET https://${at}/ HTTP/1.1\r\nHost: ${at}\r\n\r\n`);
      assert.match(r, /^HTTP\/1\.1 502 [\s\S]*could not connect to 127\.0\.0\.2:\d+ \(self[- ]signed certificate/);
      assert.deepEqual(upstream.seen, [{ method: "CONNECT", target: at }]);
    } finally {
      server.close();
      await upstream.close();
    }
  });

  test("what the guard refuses never reaches the proxy; a proxy's refusal is a 502 that says so", async () => {
    const upstream = await new HttpProxy("user:pw").start();
    const server = await egressPort({ httpProxy: upstream.url, httpsProxy: upstream.url });
    try {
      const inward = await ask(server, `GET http://127.0.0.3:${port(sentinel)}/ HTTP/1.1\r\n\r\n`);
      assert.match(inward, /^HTTP\/1\.1 403 [\s\S]*127\.0\.0\.3 is not a public address/);
      assert.deepEqual(upstream.seen, []);
      assert.equal(sentinelHits, 0);
      const at = `127.0.0.2:${port(site)}`;
      const refused = await ask(server, `GET http://${at}/ HTTP/1.1\r\n\r\n`);
      assert.match(
        refused,
        /^HTTP\/1\.1 502 [\s\S]*could not connect to 127\.0\.0\.2:\d+ \(the proxy refused the tunnel \(HTTP 407\)\)/,
      );
      assert.ok(!refused.includes("pw"));
    } finally {
      server.close();
      await upstream.close();
    }
  });

  test("credentials in the proxy's URL are sent; NO_PROXY's hosts go directly", async () => {
    const upstream = await new HttpProxy("user:pw").start();
    const withCredentials = upstream.url.replace("http://", "http://user:pw@");
    const chained = await egressPort({ httpProxy: withCredentials });
    const bypass = await egressPort({ httpProxy: upstream.url, noProxy: "127.0.0.2" });
    try {
      const at = `127.0.0.2:${port(site)}`;
      assert.match(await ask(chained, `GET http://${at}/a HTTP/1.1\r\n\r\n`), /site: GET \/a/);
      assert.equal(upstream.seen.length, 1);
      assert.match(await ask(bypass, `GET http://${at}/b HTTP/1.1\r\n\r\n`), /site: GET \/b/);
      assert.equal(upstream.seen.length, 1, "the host NO_PROXY names went directly");
    } finally {
      chained.close();
      bypass.close();
      await upstream.close();
    }
  });
});

describe("one checked request a connection", () => {
  test("a second request written on a checked connection never leaves; the first is answered", async () => {
    const server = await egressPort(undefined);
    const requests: string[] = [];
    const count = (req: { method?: string; url?: string; headers: { host?: string } }) =>
      requests.push(`${req.method} ${req.url} ${req.headers.host}`);
    site.on("request", count);
    try {
      const at = `127.0.0.2:${port(site)}`;
      // Pipelined after a GET, and after a POST's body: the second names another site by Host.
      const second = "GET /smuggled HTTP/1.1\r\nHost: other.example\r\n\r\n";
      const afterGet = await ask(server, `GET http://${at}/one HTTP/1.1\r\nHost: ${at}\r\n\r\n${second}`);
      const afterPost = await ask(
        server,
        `POST http://${at}/two HTTP/1.1\r\nHost: ${at}\r\nContent-Length: 5\r\n\r\nhello${second}`,
      );
      // And sent later, once the first answer is in, as a keep-alive client would.
      const later = await ask(server, `GET http://${at}/three HTTP/1.1\r\nHost: ${at}\r\n\r\n`, { afterHead: second });
      assert.deepEqual(requests, [`GET /one ${at}`, `POST /two ${at}`, `GET /three ${at}`]);
      for (const [answer, path] of [
        [afterGet, "/one"],
        [afterPost, "/two"],
        [later, "/three"],
      ]) {
        assert.equal(answer.match(/HTTP\/1\.1 200/g)?.length, 1, answer);
        assert.match(answer, new RegExp(`site: \\w+ ${path} for`));
      }
    } finally {
      site.off("request", count);
      server.close();
    }
  });

  test("a chunked body is refused with 411 before anything is sent; two lengths with 400", async () => {
    const server = await egressPort(undefined);
    let reached = 0;
    const count = () => reached++;
    site.on("request", count);
    try {
      const at = `127.0.0.2:${port(site)}`;
      const chunked = await ask(
        server,
        `POST http://${at}/c HTTP/1.1\r\nHost: ${at}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n`,
      );
      assert.match(chunked, /^HTTP\/1\.1 411 Length Required[\s\S]*needs a Content-Length/);
      const twice = await ask(
        server,
        `POST http://${at}/d HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 20\r\n\r\nx`,
      );
      assert.match(twice, /^HTTP\/1\.1 400 [\s\S]*one Content-Length/);
      assert.equal(reached, 0);
    } finally {
      site.off("request", count);
      server.close();
    }
  });
});
