// A deployment whose environment names an HTTP proxy (http_proxy, https_proxy: set host-wide in
// many companies, so that model calls can leave). grpc-js reads the same variables and, unless
// told otherwise, sent every call between Troupe's services to that proxy: internal traffic left
// the host, or failed where the proxy refuses internal addresses. Now Troupe's services talk
// directly, the CLI reaches a gateway on this machine directly, and only outbound calls take the
// proxy (test/unit/outbound-proxy.test.ts), the agent's web tools among them: tunnelled to the
// address their guard checked. The proxy here carries whatever it is given, so a call sent to it
// would still succeed: what it saw is the test.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { HttpProxy } from "./helpers/http-proxy.js";
import { ChatSession } from "./helpers/session.js";
import { of } from "./helpers/turn-stack.js";
import { startStack, troupeChat, type Stack } from "./helpers/stack.js";

let proxy: HttpProxy;
let stack: Stack;
let proxyEnv: Record<string, string>;
/** A page on 127.0.0.2, an address the runner's policy is told to treat as public. */
let page: Server;

before(async () => {
  proxy = await new HttpProxy().start();
  proxyEnv = { http_proxy: proxy.url, https_proxy: proxy.url, grpc_proxy: proxy.url };
  page = createServer((req, res) =>
    res.writeHead(200, { "content-type": "text/plain" }).end(`a page for ${req.headers.host}`),
  );
  await new Promise<void>((r) => page.listen(0, "127.0.0.2", r));
  const port = (page.address() as AddressInfo).port;
  stack = await startStack({
    env: { ...proxyEnv, TROUPE_NET_ALLOW: "127.0.0.2/32", TROUPE_NET_PORTS: `80,443,${port}` },
  });
});
after(async () => {
  await stack?.stop();
  await proxy?.close();
  page?.closeAllConnections();
  page?.close();
});

test("with a proxy in the environment, a turn through every service sends nothing to the proxy", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("proxied-1", true);
  await s.waitOpened();
  // A tool call (runner -> sandbox) and the turn's recall (runner -> memory), besides gateway ->
  // router -> runner and the runner's registration with the router.
  s.prompt("$ echo through-the-services");
  const end = await s.waitForPayload("agentEnd", 60_000);
  assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
  s.close();
  assert.deepEqual(proxy.seen, [], "calls between the services went to the proxy");
});

test("the CLI reaches a gateway on this machine directly, whatever proxy the environment names", async () => {
  const { stdout } = await troupeChat(stack, ["--session", "proxied-cli", "$ echo cli"], {
    env: { ...process.env, ...proxyEnv },
  });
  assert.equal(stdout, "Tool results: cli [exit 0]\n");
  assert.deepEqual(proxy.seen, []);
});

test("the runner's web_fetch leaves through the proxy, tunnelled to the address its guard checked", async () => {
  proxy.seen.length = 0;
  const url = `http://127.0.0.2:${(page.address() as AddressInfo).port}/`;
  const s = new ChatSession(stack.gateway);
  s.open("proxied-web", true);
  await s.waitOpened();
  const [fetched] = of(await s.turn(`!call web_fetch {"url": "${url}"}`, 60_000), "toolExecutionEnd");
  assert.equal(fetched.isError, false, fetched.result);
  assert.match(fetched.result, /a page for 127\.0\.0\.2:\d+/);
  // A refused address is refused before the proxy hears of it.
  const metadata = 'web_fetch {"url": "http://169.254.169.254/latest/meta-data/"}';
  const [refused] = of(await s.turn(`!call ${metadata}`, 60_000), "toolExecutionEnd");
  assert.match(refused.result, /^web_fetch refused: 169\.254\.169\.254/);
  s.close();
  assert.deepEqual(proxy.seen, [{ method: "CONNECT", target: new URL(url).host }]);
});
