// `troupe up` as a local cluster: two runners, two routers and two gateways on a PostgreSQL server
// of its own (Debian's package, in the data directory), what runs written to up.json, every
// gateway serving, and a clean stop of all of it on SIGTERM.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { access, chmod, mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { internalCredentials } from "../services/shared/auth/auth.js";
import { createClient } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { MAIN, isAlive, startUp, stopUp } from "./helpers/stack.js";

interface UpFile {
  supervisor: number;
  store?: { service: string; address: string; pid: number };
  services: { service: string; address: string; pid: number | null }[];
}

describe("troupe up --runners 2 --gateways 2 --routers 2 --store postgres", () => {
  let dataDir: string;
  let up: ChildProcess;
  let log: () => string;
  const env = { TROUPE_RUNNER_LIVENESS_MS: "3000", TROUPE_STORE_URL: undefined };

  before(async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-upc-"));
    await chmod(dataDir, 0o711);
    const args = ["--runners", "2", "--gateways=2", "--routers", "2", "--store", "postgres"];
    ({ proc: up, log } = await startUp(dataDir, { args, env, timeoutMs: 90_000 }));
  });
  after(async () => {
    await stopUp(up);
    await rm(dataDir, { recursive: true, force: true });
  });

  test("writes what it started to up.json, serves through every gateway, and stops it all on SIGTERM", async () => {
    const file = JSON.parse(await readFile(path.join(dataDir, "up.json"), "utf8")) as UpFile;
    const names = file.services.map((s) => s.service).sort();
    assert.deepEqual(names, [
      "gateway",
      "gateway-2",
      "memory",
      "model-server",
      "router",
      "router-2",
      "runner",
      "runner-2",
      "sandbox",
    ]);
    assert.equal(file.supervisor, up.pid);
    assert.ok(file.store && isAlive(file.store.pid), "the PostgreSQL server it started is running");
    for (const s of file.services) assert.ok(s.pid && isAlive(s.pid), `${s.service} runs as ${s.pid}`);
    const gateways = file.services.filter((s) => s.service.startsWith("gateway")).map((s) => s.address);
    for (const g of gateways) assert.match(log(), new RegExp(g.replace(/\./g, "\\.")), "printed the gateway addresses");

    const key = (await readFile(path.join(dataDir, "auth", "dev-key"), "utf8")).trim();
    const headers = { authorization: `Bearer ${key}` };
    for (const [i, address] of gateways.entries()) {
      const gw = createClient(GatewayService, address, { headers });
      const s = new ChatSession(gw);
      s.open(`up-${i}`);
      await s.waitOpened();
      const events = await s.turn(`hello ${i}`);
      assert.ok(events.some((e) => e.payload.case === "agentEnd"));
      s.close();
      gw.close();
    }
    // Both routers see both runners: membership is in the store.
    const { headers: internal } = await internalCredentials(dataDir);
    for (const r of file.services.filter((s) => s.service.startsWith("router"))) {
      const router = createClient(RouterService, r.address, { headers: internal });
      const { runners } = await router.listRunners({});
      router.close();
      assert.deepEqual(runners.map((x) => x.runnerId).sort(), ["runner-1", "runner-2"], r.service);
    }

    const exited = new Promise<number | null>((resolve) => up.once("exit", (code) => resolve(code)));
    up.kill("SIGTERM");
    assert.equal(await exited, 0);
    for (const s of file.services) assert.ok(!isAlive(s.pid!), `${s.service} stopped`);
    assert.ok(!isAlive(file.store!.pid), "the PostgreSQL server stopped");
    await assert.rejects(access(path.join(dataDir, "up.json")), "up.json goes with the processes");
  });
});

describe("troupe up refuses shapes it cannot run", () => {
  const withoutStore = { ...process.env };
  delete withoutStore.TROUPE_STORE_URL;
  for (const [args, message] of [
    [["--runners", "0"], /--runners must be a whole number from 1 to 99, not "0"/],
    [["--gateways", "two"], /--gateways must be a whole number/],
    [["--store", "mysql"], /--store must be files or postgres, not "mysql"/],
    [["--routers", "2"], /more than one router needs runner membership in a shared store/],
    [["--one-process", "--runners", "2"], /--one-process runs one of each service/],
  ] as const) {
    test(args.join(" "), () => {
      const out = spawnSync(process.execPath, [MAIN, "up", ...args, "--data-dir", os.tmpdir()], {
        encoding: "utf8",
        env: withoutStore,
      });
      assert.equal(out.status, 1);
      assert.match(out.stderr, message);
    });
  }
});

test("--store postgres under a folder the postgres user cannot enter stops before initdb, saying what to do", () => {
  // As root (as make test runs), the server runs as the postgres user: a data directory below a
  // 0700 folder of root's (its home, say) is out of that user's reach.
  const locked = mkdtempSync(path.join(os.tmpdir(), "troupe-locked-"));
  try {
    const dataDir = path.join(locked, "data");
    const env = { ...process.env };
    delete env.TROUPE_STORE_URL;
    const out = spawnSync(process.execPath, [MAIN, "up", "--store", "postgres", "--data-dir", dataDir], {
      encoding: "utf8",
      env,
      timeout: 60_000,
    });
    assert.equal(out.status, 1, out.stderr);
    assert.match(
      out.stderr,
      new RegExp(
        `postgres user, which cannot enter ${locked}, so it cannot reach its data directory ${dataDir}/postgres`,
      ),
    );
    assert.match(out.stderr, new RegExp(`setfacl -m u:postgres:x ${locked}.*chmod o\\+x ${locked}`));
    assert.doesNotMatch(out.stderr, /initdb/);
    assert.equal(existsSync(path.join(dataDir, "postgres", "PG_VERSION")), false, "initdb did not run");
  } finally {
    rmSync(locked, { recursive: true, force: true });
  }
});
