// TLS between Troupe's services (TROUPE_INTERNAL_TLS_CA): every service serves TLS with its
// certificate, and calls the others over TLS trusting the internal CA. A turn with a tool call
// crosses all of them; a plain client and one trusting another CA are refused at each internal
// port; a service told to use internal TLS without a certificate does not start.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { Health } from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { caAndServer } from "./helpers/certs.js";
import { MAIN, startStack, troupeChat, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
const INTERNAL = ["router", "memory", "sandbox", "runner"] as const;
let dir = "";
let stack: Stack;
const f = (name: string) => path.join(dir, name);

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "troupe-internal-tls-"));
  caAndServer(dir, "inner");
  caAndServer(dir, "stranger");
  const tls = {
    TROUPE_TLS_CERT: f("inner.pem"),
    TROUPE_TLS_KEY: f("inner.key"),
    TROUPE_INTERNAL_TLS_CA: f("inner-ca.pem"),
  };
  stack = await startStack({
    services: ["model-server"],
    env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" },
  });
  for (const name of [...INTERNAL, "gateway"] as const)
    await stack.startInstance(name, name, { addr: stack.addr[name], env: tls });
});

after(async () => {
  await stack?.stop();
  await rm(dir, { recursive: true, force: true });
});

test("a turn with a tool call crosses every service over TLS", async () => {
  const { stdout } = await troupeChat(stack, ["--ca", f("inner-ca.pem"), "$ echo inside-tls"], { timeout: 60_000 });
  assert.equal(stdout, "Tool results: inside-tls [exit 0]\n");
});

test("each internal port refuses a plain client and one trusting another CA", async () => {
  for (const name of INTERNAL) {
    for (const tls of [undefined, { ca: readFileSync(f("stranger-ca.pem")) }]) {
      const health = createClient(Health, stack.addr[name], { tls });
      try {
        await assert.rejects(
          health.check({ service: "" }, { timeoutMs: 2000 }),
          `${name} ${tls ? "stranger CA" : "plain"}`,
        );
      } finally {
        health.close();
      }
    }
    const trusted = createClient(Health, stack.addr[name], { tls: { ca: readFileSync(f("inner-ca.pem")) } });
    try {
      await trusted.check({ service: "" }, { timeoutMs: 2000 });
    } finally {
      trusted.close();
    }
  }
});

test("troupe status reaches the internal services over TLS", async () => {
  const { stdout } = await run(
    process.execPath,
    [
      MAIN,
      "status",
      "--data-dir",
      stack.dataDir,
      "--ca",
      f("inner-ca.pem"),
      "--internal-ca",
      f("inner-ca.pem"),
      ...addressFlags(),
    ],
    { timeout: 30_000 },
  ).catch((e) => e);
  for (const name of INTERNAL) assert.match(stdout, new RegExp(`${name}.*serving`), stdout);
});

test("internal TLS without a certificate stops the start, saying what is missing", async () => {
  const failed = await run(
    process.execPath,
    [MAIN, "router", "--router", "127.0.0.1:0", "--internal-ca", f("inner-ca.pem")],
    {
      timeout: 20_000,
      env: { ...process.env, TROUPE_TLS_CERT: "", TROUPE_TLS_KEY: "" },
    },
  ).catch((e) => e);
  assert.equal(failed.code, 1);
  assert.match(
    failed.stderr,
    /TROUPE_INTERNAL_TLS_CA is set, so the router service serves TLS: it needs --tls-cert and --tls-key/,
  );
});

function addressFlags(): string[] {
  return INTERNAL.flatMap((name) => [`--${name}`, stack.addr[name]]).concat([
    "--gateway",
    stack.addr.gateway,
    "--http",
    "off",
  ]);
}
