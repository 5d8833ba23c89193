// The sandbox service's workspace store in process: each tenant's usage against its quota, the
// reaper's rule, the warm pools per image, records that survive a crash mid-write, and the checks
// an agent's template must pass. The same parts through real processes: test/workspaces.test.ts.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { reapReason } from "../../services/sandbox/reap-rules.js";
import { WarmPools } from "../../services/sandbox/warm-pools.js";
import { AgentTemplates } from "../../services/sandbox/workspaces/templates.js";
import { readRecord, writeRecord } from "../../services/sandbox/workspaces/workspace-archive.js";
import { WorkspaceUsage } from "../../services/sandbox/workspaces/workspace-usage.js";
import { Status } from "../../services/shared/errors.js";
import { createLogger } from "../../services/shared/process/log.js";

test("a tenant's usage counts saves and snapshots together; the room left discounts the item rewritten", () => {
  const usage = new WorkspaceUsage();
  usage.set("acme", "save:a", 300);
  usage.set("acme", "snapshot:s", 500);
  usage.set("other", "save:b", 900);
  assert.equal(usage.of("acme"), 800);
  assert.equal(usage.room("acme", 1000), 200);
  assert.equal(usage.room("acme", 1000, "save:a"), 500, "a new save of a replaces its old one");
  assert.equal(usage.room("acme", 700), 0, "never negative");
  usage.delete("acme", "snapshot:s");
  assert.equal(usage.of("acme"), 300);
  assert.equal(usage.of("other"), 900, "tenants apart");
});

test("the reaper's rule: stopped, left in a pool, too old, other settings, idle; never a busy one for settings or idleness", () => {
  const limits = { maxAgeMs: 1000, idleMs: 100 };
  const base = { running: true, leftInPool: false, age: 10, idle: 10, busy: false, knownSettings: true, limits };
  assert.equal(reapReason(base), undefined);
  assert.equal(reapReason({ ...base, running: false }), "stopped");
  assert.equal(reapReason({ ...base, leftInPool: true }), "a pooled sandbox this process did not make");
  assert.equal(reapReason({ ...base, age: 2000, busy: true }), "past its maximum age");
  assert.equal(reapReason({ ...base, knownSettings: false }), "made under other settings");
  assert.equal(reapReason({ ...base, knownSettings: false, busy: true }), undefined);
  assert.equal(reapReason({ ...base, idle: 200 }), "idle");
  assert.equal(reapReason({ ...base, idle: 200, busy: true }), undefined);
});

test("warm pools are kept per image: a claim takes the oldest of its image only", () => {
  const pools = new WarmPools<{ id: string }>();
  pools.add("busybox", { id: "a" });
  pools.add("python", { id: "b" });
  pools.add("busybox", { id: "c" });
  assert.equal(pools.size, 3);
  assert.equal(pools.take("python")?.id, "b");
  assert.equal(pools.take("python"), undefined);
  assert.equal(pools.remove("c")?.id, "c");
  assert.equal(pools.sizeOf("busybox"), 1);
  assert.deepEqual(
    pools.clear().map((s) => s.id),
    ["a"],
  );
  assert.equal(pools.size, 0);
});

test("the pool of an image nothing names now is let go, the others kept", () => {
  const pools = new WarmPools<{ id: string }>();
  pools.add("busybox", { id: "a" });
  pools.add("python", { id: "b" });
  pools.add("python", { id: "c" });
  assert.deepEqual(
    pools.dropExcept(new Set(["busybox", "node"])).map((s) => s.id),
    ["b", "c"],
  );
  assert.equal(pools.sizeOf("python"), 0);
  assert.equal(pools.take("busybox")?.id, "a");
  assert.deepEqual(pools.dropExcept(new Set()), []);
});

test("a record is written whole or not at all, and a damaged one reads as missing", async (t) => {
  const dir = await mkdtemp(path.join(tmpdir(), "troupe-records-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = path.join(dir, "r.json");
  await writeRecord(file, { key: "k", bytes: 3 });
  assert.deepEqual(await readRecord(file), { key: "k", bytes: 3 });
  assert.deepEqual(await readdir(dir), ["r.json"], "nothing left beside it");
  await writeFile(file, '{"key": "k", "by');
  assert.equal(await readRecord(file), undefined);
  assert.equal(await readRecord(path.join(dir, "missing.json")), undefined);
});

test("a template: only allowed images, files that match their hash, files or a snapshot; kept across a restart", async (t) => {
  const dir = await mkdtemp(path.join(tmpdir(), "troupe-templates-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const logger = createLogger("test", "error");
  const templates = new AgentTemplates(dir, "troupe-sandbox:busybox", ["troupe-sandbox:mcp"], 1024, logger);
  const files = Buffer.from("an archive");
  const sha = createHash("sha256").update(files).digest("hex");
  const code = (p: Promise<unknown>) =>
    p.then(
      () => Status.OK,
      (e: { code: Status }) => e.code,
    );
  assert.equal(await code(templates.put("a", "alpine", files, sha)), Status.FAILED_PRECONDITION);
  assert.equal(await code(templates.put("a", "", files, "0".repeat(64))), Status.INVALID_ARGUMENT);
  assert.equal(await code(templates.put("a", "", Buffer.alloc(2048), "")), Status.INVALID_ARGUMENT);
  const snapshot = "snap-00000000-0000-4000-8000-000000000000";
  assert.equal(await code(templates.put("a", "", files, sha, snapshot)), Status.INVALID_ARGUMENT);
  assert.equal(await code(templates.put("../a", "", files, sha)), Status.INVALID_ARGUMENT);
  assert.equal(await templates.put("a", "troupe-sandbox:mcp", files, sha), true);
  assert.equal(await templates.put("a", "troupe-sandbox:mcp", files, sha), false, "the same again changes nothing");
  const none = async () => undefined;
  assert.equal(templates.of("a", none).image, "troupe-sandbox:mcp");
  assert.ok(templates.of("a", none).files?.endsWith(`${sha}.tar`));
  assert.deepEqual(templates.of("b", none), { agentId: "b", image: "troupe-sandbox:busybox" });
  assert.deepEqual([...templates.usedImages()].sort(), ["troupe-sandbox:busybox", "troupe-sandbox:mcp"]);

  const again = new AgentTemplates(dir, "troupe-sandbox:busybox", ["troupe-sandbox:mcp"], 1024, logger);
  await again.load();
  assert.equal(again.of("a", none).image, "troupe-sandbox:mcp", "read back after a restart");
  // An image the operator no longer allows is not used after a restart.
  const stricter = new AgentTemplates(dir, "troupe-sandbox:busybox", [], 1024, logger);
  await stricter.load();
  assert.equal(stricter.of("a", none).image, "troupe-sandbox:busybox");

  assert.equal(await templates.put("a", "", Buffer.alloc(0), ""), true, "an empty template removes it");
  assert.deepEqual(await readdir(path.join(dir, "files")), [], "its files went with it");
});
