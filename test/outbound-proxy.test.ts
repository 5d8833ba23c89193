// A deployment whose environment names an HTTP proxy (http_proxy, https_proxy: set host-wide in
// many companies, so that model calls can leave). grpc-js reads the same variables and, unless
// told otherwise, sent every call between Troupe's services to that proxy: internal traffic left
// the host, or failed where the proxy refuses internal addresses. Now Troupe's services talk
// directly, the CLI reaches a gateway on this machine directly, and only outbound calls take the
// proxy (test/unit/outbound-proxy.test.ts). The proxy here carries whatever it is given, so a call
// sent to it would still succeed: what it saw is the test.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { HttpProxy } from "./helpers/http-proxy.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, troupeChat, type Stack } from "./helpers/stack.js";

let proxy: HttpProxy;
let stack: Stack;
let proxyEnv: Record<string, string>;

before(async () => {
  proxy = await new HttpProxy().start();
  proxyEnv = { http_proxy: proxy.url, https_proxy: proxy.url, grpc_proxy: proxy.url };
  stack = await startStack({ env: proxyEnv });
});
after(async () => {
  await stack?.stop();
  await proxy?.close();
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
