// Which gRPC clients take the proxy the environment names (grpc-js reads https_proxy), against a
// forward proxy written from the RFCs (test/helpers/http-proxy.ts) and a real gRPC server. The
// client commands' gateway client does, as any gRPC client does, except to a gateway on this
// machine; a channel adapter's does not (it runs beside the gateway); nor does any client between
// Troupe's services (test/outbound-proxy.test.ts runs a whole stack that way).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { gatewayClient } from "../../services/cli/gateway-client.js";
import { loadConfig } from "../../services/shared/config/config.js";
import { GatewayService } from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import { createClient } from "../../services/shared/rpc.js";
import { HttpProxy } from "../helpers/http-proxy.js";
import { freePort, MAIN } from "../helpers/stack.js";

/** This machine's first address that is not loopback: a gateway "elsewhere" that the test can reach. */
const outside = Object.values(os.networkInterfaces())
  .flat()
  .find((a) => a && a.family === "IPv4" && !a.internal)?.address;

let proxy: HttpProxy;
let server: grpc.Server;
let port: number;

before(async () => {
  // Not skipped without one: a test that quietly does not run would pass in CI, where every
  // machine has one (eth0, and docker0 once the engine runs).
  assert.ok(outside, "these tests need a non-loopback IPv4 address on this machine");
  proxy = await new HttpProxy().start();
  // A gRPC server with no services: every call is UNIMPLEMENTED, over a real connection.
  server = new grpc.Server();
  port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("0.0.0.0:0", grpc.ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    ),
  );
  process.env.https_proxy = proxy.url;
});
after(async () => {
  delete process.env.https_proxy;
  server.forceShutdown();
  await proxy.close();
});

/** One call through `client`; resolves with the status code it ended with. */
async function call(client: ReturnType<typeof createClient<(typeof GatewayService)["method"]>>): Promise<number> {
  try {
    await client.listSessions({}, { timeoutMs: 5000 });
    return grpc.status.OK;
  } catch (err) {
    return (err as { code: number }).code;
  } finally {
    client.close();
  }
}

const cfgFor = (gateway: string) => loadConfig(["--gateway", gateway], { TROUPE_API_KEY: "trp_test" });
const seen = () => proxy.seen.map((r) => `${r.method} ${r.target}`);

test("the client commands' gateway client takes the proxy to a gateway elsewhere", async () => {
  const before = proxy.seen.length;
  assert.equal(await call(await gatewayClient(cfgFor(`${outside}:${port}`))), grpc.status.UNIMPLEMENTED);
  assert.deepEqual(seen().slice(before), [`CONNECT ${outside}:${port}`]);
});

test("...but not to a gateway on this machine", async () => {
  const before = proxy.seen.length;
  assert.equal(await call(await gatewayClient(cfgFor(`127.0.0.1:${port}`))), grpc.status.UNIMPLEMENTED);
  assert.deepEqual(seen().slice(before), []);
});

test("a channel adapter's gateway client and the services' clients never take it", async () => {
  const before = proxy.seen.length;
  const adapter = await gatewayClient(cfgFor(`${outside}:${port}`), { throughProxy: false });
  assert.equal(await call(adapter), grpc.status.UNIMPLEMENTED);
  assert.equal(await call(createClient(GatewayService, `${outside}:${port}`)), grpc.status.UNIMPLEMENTED);
  assert.deepEqual(seen().slice(before), []);
});

test("troupe adapter reaches a gateway elsewhere directly, with the proxy in its environment", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "adapter-proxy-"));
  const before = proxy.seen.length;
  const adapter = spawn(
    process.execPath,
    [
      MAIN,
      "adapter",
      "webhook",
      "--gateway",
      `${outside}:${port}`,
      "--data-dir",
      dir,
      "--listen",
      `127.0.0.1:${await freePort()}`,
    ],
    {
      env: {
        ...process.env,
        https_proxy: proxy.url,
        TROUPE_API_KEY: "trp_test",
        TROUPE_WEBHOOK_SECRET: "s3cret",
        TROUPE_WEBHOOK_REPLY_URL: "http://127.0.0.1:9/replies",
        TROUPE_LOG_FORMAT: "text",
      },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let output = "";
  for (const s of [adapter.stdout, adapter.stderr]) s.on("data", (b: Buffer) => (output += b.toString()));
  try {
    // The adapter opens its inbox stream at start; the server answers UNIMPLEMENTED and it retries.
    for (const end = Date.now() + 15_000; !/UNIMPLEMENTED/.test(output) && Date.now() < end; )
      await new Promise((r) => setTimeout(r, 100));
    assert.match(output, /inbox stream broke.*UNIMPLEMENTED/, `the adapter never reached the gateway:\n${output}`);
    assert.deepEqual(seen().slice(before), []);
  } finally {
    adapter.kill("SIGKILL");
    await once(adapter, "exit");
    await rm(dir, { recursive: true, force: true });
  }
});
