// The gateway over TLS, with certificates made here by openssl: `troupe chat --ca` and the Python
// client (grpcio) run turns through it; a plain or untrusting client is refused; a renewed
// certificate is served without a restart; files that do not make a key pair stop the start.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { copyFile, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { readFileSync } from "node:fs";
import { request } from "node:https";
import http2 from "node:http2";
import net from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { caAndServer } from "./helpers/certs.js";
import { freePort, MAIN, startStack, waitFor, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, "../..");
let dir = "";
let stack: Stack;
let gateway = "";
let http = "";
const f = (name: string) => path.join(dir, name);

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "troupe-tls-"));
  caAndServer(dir, "first");
  caAndServer(dir, "second");
  await copyFile(f("first.pem"), f("server.pem"));
  await copyFile(f("first.key"), f("server.key"));
  stack = await startStack({
    services: ["model-server", "router", "memory", "sandbox", "runner"],
    env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" },
  });
  http = `127.0.0.1:${await freePort()}`;
  gateway = await stack.startInstance("gateway-tls", "gateway", {
    args: ["--http", http],
    env: {
      TROUPE_TLS_CERT: f("server.pem"),
      TROUPE_TLS_KEY: f("server.key"),
      TROUPE_TLS_CA: f("first-ca.pem"),
      TROUPE_HTTP_FIRST_BYTE_MS: "800",
      TROUPE_HTTP_HEAD_MS: "1200",
    },
  });
});

after(async () => {
  await stack?.stop();
  await rm(dir, { recursive: true, force: true });
});

const chat = (...args: string[]) =>
  run(process.execPath, [MAIN, "chat", "--data-dir", stack.dataDir, "--gateway", gateway, ...args], {
    timeout: 30_000,
  });
const failure = (p: Promise<unknown>) =>
  p.then(
    () => assert.fail("expected a failure"),
    (e: { code: number; stderr: string }) => e,
  );

test("troupe chat over TLS with --ca; a plain client and one that does not trust the CA are refused", async () => {
  const { stdout } = await chat("--ca", f("first-ca.pem"), "hello over tls");
  assert.equal(stdout, "You said: hello over tls\n");
  const plain = await failure(chat("hello"));
  assert.equal(plain.code, 1);
  assert.match(plain.stderr, /UNAVAILABLE/);
  const systemRoots = await failure(chat("--tls", "hello"));
  assert.equal(systemRoots.code, 1);
  assert.match(systemRoots.stderr, /UNAVAILABLE/);
  const otherCa = await failure(chat("--ca", f("second-ca.pem"), "hello"));
  assert.equal(otherCa.code, 1);
});

test("the Python client (grpcio) runs its turns over TLS", { timeout: 120_000 }, async () => {
  const gen = path.join(ROOT, ".gen/python");
  assert.ok(
    existsSync(`${gen}/troupe/v1/gateway_pb2_grpc.py`),
    "stubs missing: run `make python-client` (make test does)",
  );
  const { stdout } = await run(
    "/usr/bin/python3",
    [
      path.join(ROOT, "examples/python/troupe_client.py"),
      "--gateway",
      gateway,
      "--ca",
      f("first-ca.pem"),
      "--session",
      "py-tls",
    ],
    { env: { ...process.env, PYTHONPATH: gen, TROUPE_API_KEY: stack.apiKey }, timeout: 100_000 },
  );
  assert.match(stdout, /turn with a tool call: \d+ events, tool said 'hello from python'/);
  assert.match(stdout, /^OK$/m);
});

/** ListSessions over HTTPS/1.1 (as curl --cacert does), trusting `ca`: the status, or the TLS error. */
const overHttps = (ca: string) =>
  new Promise<string>((resolve) => {
    const [host, port] = http.split(":");
    const req = request(
      {
        host,
        port: Number(port),
        path: "/troupe.v1.GatewayService/ListSessions",
        method: "POST",
        ca: readFileSync(ca),
        servername: "localhost",
        headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
      },
      (res) => (res.resume(), resolve(`${res.statusCode} ${(res.socket as TLSSocket).alpnProtocol || "http/1.1"}`)),
    );
    req.on("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
    req.end("{}");
  });

test("the HTTP API over TLS: HTTP/1.1 and HTTP/2 (by ALPN) with the CA, refused without it", async () => {
  assert.equal(await overHttps(f("first-ca.pem")), "200 http/1.1");
  assert.match(await overHttps(f("second-ca.pem")), /UNABLE_TO_VERIFY|SELF_SIGNED|CERT/);
  const client = createClient(
    GatewayService,
    createConnectTransport({
      baseUrl: `https://localhost:${http.split(":")[1]}`,
      httpVersion: "2",
      nodeOptions: { ca: readFileSync(f("first-ca.pem")) },
    }),
  );
  const { session } = await client.createSession({}, { headers: { authorization: `Bearer ${stack.apiKey}` } });
  assert.ok(session?.created);
  const plain = await fetch(`http://${http}/healthz`).then(
    (r) => r.status,
    () => "refused",
  );
  assert.equal(plain, "refused", "plain HTTP on the TLS port");
});

test("over TLS too, no connection is held: a silent one, half a handshake, half a head, no stream", async () => {
  const port = Number(http.split(":")[1]);
  const closedWithin = (socket: net.Socket | TLSSocket) => {
    const start = performance.now();
    socket.on("error", () => undefined);
    return new Promise<number>((resolve) => socket.on("close", () => resolve(performance.now() - start)));
  };
  const silent = net.connect(port, "127.0.0.1");
  assert.ok((await closedWithin(silent)) < 800 + 1000, "a silent connection");
  // A ClientHello's first bytes, then nothing: the handshake is due within the first-byte deadline.
  const halfHello = net.connect(port, "127.0.0.1", () => halfHello.write(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00])));
  assert.ok((await closedWithin(halfHello)) < 800 + 1000, "half a handshake");
  const ca = readFileSync(f("first-ca.pem"));
  const h1 = tlsConnect({ port, host: "127.0.0.1", servername: "localhost", ca, ALPNProtocols: ["http/1.1"] }, () =>
    h1.write("GET /healthz HTTP/1.1\r\nHost: x\r\n"),
  );
  assert.ok((await closedWithin(h1)) < 1200 + 1000, "half a head over TLS");
  const h2 = http2.connect(`https://localhost:${port}`, { ca });
  h2.on("error", () => undefined);
  const h2Start = performance.now();
  await new Promise((resolve) => h2.on("close", resolve));
  assert.ok(performance.now() - h2Start < 1200 + 1500, "a streamless HTTP/2 session");
});

test("a renewed certificate is served without a restart", async () => {
  await copyFile(f("second.pem"), f("server.pem"));
  await copyFile(f("second.key"), f("server.key"));
  // Read again within 5 s; existing connections keep their session, new ones get the new chain.
  await waitFor(
    "the gateway to serve the renewed certificate",
    async () => (await chat("--ca", f("second-ca.pem"), "renewed")).stdout === "You said: renewed\n",
    20_000,
    500,
  );
  assert.equal((await failure(chat("--ca", f("first-ca.pem"), "old"))).code, 1);
  // The HTTP address too.
  await waitFor(
    "HTTPS to serve the renewed certificate",
    async () => (await overHttps(f("second-ca.pem"))) === "200 http/1.1",
    20_000,
    500,
  );
});

test("a certificate without its key, or with another's key, stops the start with the reason", async () => {
  const start = (env: NodeJS.ProcessEnv) =>
    failure(
      run(
        process.execPath,
        [MAIN, "gateway", "--data-dir", stack.dataDir, "--gateway", "127.0.0.1:0", "--http", "off"],
        {
          env: { ...process.env, ...env },
          timeout: 20_000,
        },
      ),
    );
  const lone = await start({ TROUPE_TLS_CERT: f("first.pem") });
  assert.notEqual(lone.code, 0);
  assert.match(lone.stderr, /TROUPE_TLS_CERT and TROUPE_TLS_KEY go together/);
  const mismatched = await start({ TROUPE_TLS_CERT: f("first.pem"), TROUPE_TLS_KEY: f("second.key") });
  assert.notEqual(mismatched.code, 0);
  assert.match(mismatched.stderr, /first\.pem and .*second\.key are not a certificate and its key/);
  const missing = await start({ TROUPE_TLS_CERT: f("nope.pem"), TROUPE_TLS_KEY: f("first.key") });
  assert.match(missing.stderr, /the TLS certificate .*nope\.pem cannot be read: ENOENT/);
});
