// A sandbox's way out, under runc and runsc: commands granted hosts reach them through the egress
// proxy (the agent's loopback port, carried over its channel to the service) and nothing else.
// The test hosts are on 127.0.0.2 and 127.0.0.3, which the service's policy treats as public
// (TROUPE_NET_ALLOW); the guard still refuses every other private address, granted or not.
// Each refused target's server counts connections: a refusal must reach it not at all.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import { createServer as createHttpServer, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import path from "node:path";
import { createServer as createTcpServer, type AddressInfo, type Server as TcpServer } from "node:net";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { exec, type SandboxClient } from "./helpers/sandbox.js";
import { selfSigned } from "./helpers/certs.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";
import { HttpProxy } from "./helpers/http-proxy.js";

const BIG = Buffer.alloc(1 << 20, "x");
let web: Server;
let echo: TcpServer;
let sentinel: Server;
let webPort = 0;
let echoPort = 0;
let sentinelPort = 0;
let sentinelConnections = 0;
/** https servers: one with a certificate for 127.0.0.2, one whose certificate names another host. */
let secure: Server;
let impostor: Server;
let securePort = 0;
let impostorPort = 0;
/** The certificates above and the upstream proxy's, for the sandbox service to trust (NODE_EXTRA_CA_CERTS). */
let trusted = "";
/** The deployment's proxy's certificate, for 127.0.0.1 (the last describe). */
let proxyCert: { cert: string; key: string };
let dir = "";
const seen: { url: string; host: string; connection: string }[] = [];

const listen = (server: Server | TcpServer, host: string) =>
  new Promise<number>((resolve) => server.listen(0, host, () => resolve((server.address() as AddressInfo).port)));

before(async () => {
  web = createHttpServer((req, res) => {
    seen.push({ url: req.url ?? "", host: req.headers.host ?? "", connection: req.headers.connection ?? "" });
    if (req.url === "/big") return void res.end(BIG);
    res.end(`hello from the allowed host, you asked for ${req.url}\n`);
  });
  echo = createTcpServer((socket) => socket.on("data", (d) => socket.write(d.toString("utf8").toUpperCase())));
  sentinel = createHttpServer((_req, res) => res.end("SENTINEL REACHED\n"));
  sentinel.on("connection", () => sentinelConnections++);
  dir = mkdtempSync(path.join(os.tmpdir(), "troupe-egress-certs-"));
  const good = selfSigned(dir, "good", "127.0.0.2", "IP:127.0.0.2");
  const other = selfSigned(dir, "other", "other.example", "DNS:other.example");
  proxyCert = selfSigned(dir, "proxy", "127.0.0.1", "IP:127.0.0.1");
  trusted = path.join(dir, "trusted.pem");
  writeFileSync(
    trusted,
    readFileSync(good.cert, "utf8") + readFileSync(other.cert, "utf8") + readFileSync(proxyCert.cert, "utf8"),
  );
  const tls = (c: { cert: string; key: string }) => ({ cert: readFileSync(c.cert), key: readFileSync(c.key) });
  secure = createHttpsServer(tls(good), (req, res) => res.end(`hello over TLS, you asked for ${req.url}\n`));
  impostor = createHttpsServer(tls(other), (_req, res) => res.end("IMPOSTOR\n"));
  [webPort, echoPort, sentinelPort, securePort, impostorPort] = await Promise.all([
    listen(web, "127.0.0.2"),
    listen(echo, "127.0.0.2"),
    listen(sentinel, "127.0.0.3"),
    listen(secure, "127.0.0.2"),
    listen(impostor, "127.0.0.2"),
  ]);
});

after(() => {
  for (const s of [web, sentinel, secure, impostor]) s.closeAllConnections();
  for (const s of [web, echo, sentinel, secure, impostor]) s.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A raw proxy request through the egress port, as a client would send it; prints the whole answer. */
const raw = (request: string, waitS = 0.5) =>
  `{ printf '${request.replace(/\r\n/g, "\\r\\n")}'; sleep ${waitS}; } | nc 127.0.0.1 3128; echo; echo end`;

for (const runtime of ["runc", "runsc"] as const) {
  describe(`sandbox egress (${runtime})`, () => {
    let stack: Stack;
    let sandbox: SandboxClient;
    const grant = { allowHosts: ["127.0.0.2", "169.254.169.254", "localhost", "10.0.0.1"] };
    const session = (n: string) => `egress-${runtime}-${n}`;

    before(async () => {
      stack = await startStack({
        services: ["sandbox"],
        env: {
          TROUPE_SANDBOX_RUNTIME: runtime,
          TROUPE_SANDBOX_POOL: "0",
          TROUPE_NET_ALLOW: "127.0.0.2/32,127.0.0.3/32",
          TROUPE_NET_PORTS: `80,443,${webPort},${echoPort},${sentinelPort},${securePort},${impostorPort}`,
          NODE_EXTRA_CA_CERTS: trusted,
        },
      });
      sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
    });
    after(async () => {
      sandbox?.close();
      await stack?.stop();
    });

    test("a granted host is reached through the proxy, by wget's own proxy support", async () => {
      const before = seen.length;
      const r = await exec(sandbox, session("wget"), `wget -q -O - http://127.0.0.2:${webPort}/hello; echo "exit $?"`, {
        egress: grant,
      });
      assert.match(r.out, /hello from the allowed host, you asked for \/hello/, r.out);
      assert.match(r.out, /exit 0/);
      assert.equal(seen.length, before + 1);
      // Forwarded as one request per connection.
      assert.equal(seen.at(-1)?.connection, "close");
      const logged = new RegExp(
        `egress GET http://127\\.0\\.0\\.2:${webPort}/hello \\(127\\.0\\.0\\.2\\): done.*session:`,
      );
      await waitFor("the connection in the service's log", async () => logged.test(stack.logs()));
    });

    test("without a grant, nothing leaves: no proxy variables, and the port answers 403", async () => {
      const before = seen.length;
      const r = await exec(
        sandbox,
        session("none"),
        `env | grep -ci proxy; wget -q -T 2 -O - http://127.0.0.2:${webPort}/hello && echo FETCHED; ${raw(`GET http://127.0.0.2:${webPort}/ HTTP/1.1\r\nHost: x\r\n\r\n`)}`,
      );
      assert.match(r.out, /^0$/m, r.out);
      assert.doesNotMatch(r.out, /FETCHED|hello from/);
      assert.match(r.out, /HTTP\/1\.1 403 Forbidden[\s\S]*troupe egress: this sandbox has no way out/);
      assert.equal(seen.length, before);
    });

    test("hosts not granted, and granted ones that are not public, are refused before any connection", async () => {
      const id = session("refused");
      const cases: [string, RegExp][] = [
        [
          `GET http://127.0.0.3:${sentinelPort}/ HTTP/1.1\r\nHost: x\r\n\r\n`,
          /127\.0\.0\.3 is not among this sandbox's allowed hosts/,
        ],
        [
          `CONNECT 127.0.0.3:${sentinelPort} HTTP/1.1\r\n\r\n`,
          /127\.0\.0\.3 is not among this sandbox's allowed hosts/,
        ],
        [
          "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: x\r\n\r\n",
          /169\.254\.169\.254 is not a public address/,
        ],
        ["GET http://localhost/ HTTP/1.1\r\nHost: x\r\n\r\n", /localhost/],
        ["CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n", /10\.0\.0\.1 is not a public address/],
        [`GET http://127.0.0.2:22/ HTTP/1.1\r\nHost: x\r\n\r\n`, /port 22 is not allowed/],
        ["GET / HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n", /absolute http:\/\/ or https:\/\/ URL/],
        ["HELLO\r\n\r\n", /not an HTTP\/1 request line/],
        // IPv6 spellings, and DNS over HTTPS to a public resolver (exfiltration by DNS, attack 16).
        ["CONNECT [::1]:443 HTTP/1.1\r\n\r\n", /\[::1\] is not among this sandbox's allowed hosts/],
        [
          `GET http://[::ffff:127.0.0.2]:${webPort}/ HTTP/1.1\r\nHost: x\r\n\r\n`,
          /is not among this sandbox's allowed hosts/,
        ],
        ["CONNECT 8.8.8.8:443 HTTP/1.1\r\n\r\n", /8\.8\.8\.8 is not among this sandbox's allowed hosts/],
      ];
      for (const [request, why] of cases) {
        const r = await exec(sandbox, id, raw(request), { egress: grant });
        assert.match(r.out, /HTTP\/1\.1 (403|400)/, `${JSON.stringify(request)}: ${r.out}`);
        assert.match(r.out, why, r.out);
      }
      assert.equal(sentinelConnections, 0, "a refused target was connected to");
      // A grant opens the proxy, not the network: still no resolver, no route.
      const direct = await exec(
        sandbox,
        id,
        `nslookup example.com >/dev/null 2>&1 && echo RESOLVED; unset http_proxy; wget -q -O - http://127.0.0.2:${webPort}/ && echo FETCHED; echo end`,
        { egress: grant },
      );
      assert.doesNotMatch(direct.out, /RESOLVED|FETCHED/, direct.out);
      assert.match(direct.out, /Connection refused\nend\n$/);
    });

    test("CONNECT tunnels bytes both ways; the Host header of a plain request is the URL's", async () => {
      const id = session("tunnel");
      const tunnel = await exec(
        sandbox,
        id,
        raw(`CONNECT 127.0.0.2:${echoPort} HTTP/1.1\r\n\r\nping through the tunnel\n`, 1),
        {
          egress: grant,
        },
      );
      assert.match(tunnel.out, /^HTTP\/1\.1 200 Connection established\r\n\r\nPING THROUGH THE TUNNEL$/m, tunnel.out);
      await exec(sandbox, id, raw(`GET http://127.0.0.2:${webPort}/vhost HTTP/1.1\r\nHost: evil.example\r\n\r\n`), {
        egress: grant,
      });
      assert.equal(seen.at(-1)?.url, "/vhost");
      assert.equal(seen.at(-1)?.host, `127.0.0.2:${webPort}`);
      // A second request on the checked connection, naming another site: it never leaves.
      const before = seen.length;
      const two = await exec(
        sandbox,
        id,
        raw(`GET http://127.0.0.2:${webPort}/first HTTP/1.1\r\n\r\nGET /second HTTP/1.1\r\nHost: evil.example\r\n\r\n`),
        { egress: grant },
      );
      assert.match(two.out, /you asked for \/first/);
      assert.deepEqual(
        seen.slice(before).map((r) => r.url),
        ["/first"],
      );
      await waitFor("the refusal in the log", async () =>
        /egress GET http:\/\/127\.0\.0\.2:\d+\/first .*a second request on this connection was not passed on/.test(
          stack.logs(),
        ),
      );
    });

    test("https in absolute form (BusyBox wget's way): the proxy makes the TLS connection and checks the certificate", async () => {
      const id = session("https");
      const r = await exec(sandbox, id, `wget -q -O - https://127.0.0.2:${securePort}/secure; echo "exit $?"`, {
        egress: grant,
      });
      assert.match(r.out, /hello over TLS, you asked for \/secure\nexit 0/, r.out);
      // A certificate that names another host is refused, whoever signed it.
      const forged = await exec(
        sandbox,
        id,
        raw(`GET https://127.0.0.2:${impostorPort}/ HTTP/1.1\r\nHost: x\r\n\r\n`),
        {
          egress: grant,
        },
      );
      assert.match(forged.out, /502 Bad Gateway[\s\S]*does not match certificate/, forged.out);
      assert.doesNotMatch(forged.out, /IMPOSTOR/);
    });

    test("the byte budget cuts a download, and refuses what comes after", async () => {
      const id = session("budget");
      const small = { ...grant, budgetBytes: 200_000n };
      const r = await exec(
        sandbox,
        id,
        `wget -q -O /tmp/big http://127.0.0.2:${webPort}/big; echo "exit $?"; wc -c < /tmp/big`,
        {
          egress: small,
        },
      );
      assert.match(r.out, /exit [1-9]/, r.out);
      const got = Number(r.out.trim().split("\n").at(-1));
      assert.ok(got < 300_000, `${got} bytes came through a 200,000-byte budget`);
      const again = await exec(sandbox, id, raw(`GET http://127.0.0.2:${webPort}/hello HTTP/1.1\r\nHost: x\r\n\r\n`), {
        egress: small,
      });
      assert.match(again.out, /403 Forbidden[\s\S]*spent its egress budget of 200000 bytes/, again.out);
      await waitFor("the cut in the service's log", async () =>
        /egress GET http:\/\/127\.0\.0\.2:\d+\/big .*cut: the egress budget of 200000 bytes is spent/.test(
          stack.logs(),
        ),
      );
    });

    test("a connection flood ends at the agent's bound; the sandbox and the proxy go on serving", async () => {
      const id = session("flood");
      const r = await exec(
        sandbox,
        id,
        "for i in $(seq 1 40); do (sleep 3 | nc 127.0.0.1 3128 >/dev/null 2>&1 &) ; done; sleep 1; echo opened",
        { egress: grant },
      );
      assert.match(r.out, /opened/);
      const after = await exec(sandbox, id, `sleep 3; wget -q -O - http://127.0.0.2:${webPort}/after-flood`, {
        egress: grant,
      });
      assert.match(after.out, /you asked for \/after-flood/, after.out);
    });

    test("bad grants are refused with INVALID_ARGUMENT", async () => {
      for (const host of ["Example.COM", "exa mple.com", "*", "a/b", "x".repeat(300)]) {
        await assert.rejects(
          exec(sandbox, session("bad"), "true", { egress: { allowHosts: [host] } }),
          (e: { code: number; details: string }) => e.code === 3 && /egress\.allow_hosts/.test(e.details),
          host,
        );
      }
    });
  });
}

// Where the deployment's only way out is an HTTP proxy (here an https:// one, the harder case),
// the service chains a command's egress through it: a CONNECT tunnel to the address it checked.
// The chaining's cases are in test/unit/egress-chain.test.ts; this is the whole path, once.
describe("sandbox egress behind the deployment's proxy (runc)", () => {
  let stack: Stack;
  let sandbox: SandboxClient;
  let upstream: HttpProxy;

  before(async () => {
    upstream = await new HttpProxy(undefined, {
      key: readFileSync(proxyCert.key),
      cert: readFileSync(proxyCert.cert),
    }).start();
    stack = await startStack({
      services: ["sandbox"],
      env: {
        TROUPE_SANDBOX_RUNTIME: "runc",
        TROUPE_SANDBOX_POOL: "0",
        TROUPE_NET_ALLOW: "127.0.0.2/32",
        TROUPE_NET_PORTS: `80,443,${webPort},${securePort}`,
        NODE_EXTRA_CA_CERTS: trusted,
        https_proxy: upstream.url,
        http_proxy: upstream.url,
      },
    });
    sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
  });
  after(async () => {
    sandbox?.close();
    await stack?.stop();
    await upstream?.close();
  });

  test("wget reaches a granted host through the service and then the proxy; the log says so", async () => {
    const grant = { allowHosts: ["127.0.0.2"] };
    const r = await exec(
      sandbox,
      "egress-chained",
      `wget -q -O - http://127.0.0.2:${webPort}/chained; wget -q -O - https://127.0.0.2:${securePort}/tls; echo "exit $?"`,
      { egress: grant },
    );
    assert.match(
      r.out,
      /you asked for \/chained[\s\S]*hello over TLS, you asked for \/tls[\s\S]*exit 0/,
      `${r.out}\n${stack.logs().slice(-3000)}`,
    );
    assert.deepEqual(upstream.seen, [
      { method: "CONNECT", target: `127.0.0.2:${webPort}` },
      { method: "CONNECT", target: `127.0.0.2:${securePort}` },
    ]);
    await waitFor("the chained connection in the service's log", async () =>
      /egress GET http:\/\/127\.0\.0\.2:\d+\/chained \(127\.0\.0\.2, through the proxy at 127\.0\.0\.1:\d+\): done/.test(
        stack.logs(),
      ),
    );
  });
});
