// A `troupe up` killed with SIGKILL leaves its services and their sandboxes running; the next
// start on the same data directory ends and removes them before starting its own, and a clean
// stop leaves no container. A second `troupe up` over a running one is refused.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawnSync, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import {
  MAIN,
  SERVICE_ORDER,
  flagsFor,
  freePort,
  isAlive,
  type ServiceName,
  sandboxContainers,
  removeSandboxes,
  startUp,
  type Up,
} from "./helpers/stack.js";

const run = promisify(execFile);
let dataDir: string;
let addr: Record<ServiceName, string>;
const env: NodeJS.ProcessEnv = { ...process.env, TROUPE_LOG_FORMAT: "text" };
delete env.OPENAI_BASE_URL;
const started: ChildProcess[] = [];

async function startTroupe(): Promise<Up> {
  // Started as people do, by a path relative to where they stand: still recognised as troupe up.
  const up = await startUp(dataDir, {
    addr,
    env: { TROUPE_LOG_FORMAT: "text" },
    main: path.relative(process.cwd(), MAIN),
  });
  started.push(up.proc);
  return up;
}

const containers = () => sandboxContainers(dataDir);
before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-leftovers-"));
  addr = {} as Record<ServiceName, string>;
  for (const name of SERVICE_ORDER) addr[name] = `127.0.0.1:${await freePort()}`;
});

after(async () => {
  for (const p of started) if (p.exitCode === null) p.kill("SIGKILL");
  await removeSandboxes(dataDir);
  await rm(dataDir, { recursive: true, force: true });
});

test("the next start ends what a SIGKILLed troupe up left, and a clean stop leaves no container", async () => {
  const first = await startTroupe();
  const chat = () =>
    run(process.execPath, [MAIN, "chat", ...flagsFor(addr, dataDir), "--session", "left-1", "$ echo left"]);
  assert.match((await chat()).stdout, /left/);
  const before = JSON.parse(await readFile(path.join(dataDir, "up.json"), "utf8")) as {
    services: { service: string; pid: number }[];
  };
  const sessionContainers = await containers();
  assert.ok(sessionContainers.length > 0, "the tool turn made a sandbox");

  // A second supervisor over the same data directory would share its store: refused.
  const second = spawnSync(process.execPath, [MAIN, "up", ...flagsFor(addr, dataDir)], { env, encoding: "utf8" });
  assert.equal(second.status, 1);
  assert.match(second.stderr, new RegExp(`troupe up already runs on .* \\(pid ${first.proc.pid}\\)`));
  // On another data directory its ports are still taken: refused before anything starts, naming
  // each address (it used to restart services that could not bind, forever).
  const otherDir = await mkdtemp(path.join(os.tmpdir(), "troupe-other-"));
  try {
    const other = spawnSync(process.execPath, [MAIN, "up", ...flagsFor(addr, otherDir)], {
      env,
      encoding: "utf8",
      timeout: 30_000,
    });
    assert.equal(other.status, 1, other.stderr);
    assert.match(other.stderr, new RegExp(`cannot start: .*${addr.gateway} \\(gateway\\).* already in use`));
    assert.match(other.stderr, new RegExp(`${addr.runner} \\(runner\\)`));
    assert.doesNotMatch(other.stderr, /exited|restarting/);
    assert.equal(JSON.parse(await readFile(path.join(dataDir, "up.json"), "utf8")).supervisor, first.proc.pid);
  } finally {
    await rm(otherDir, { recursive: true, force: true });
  }

  first.proc.kill("SIGKILL");
  await once(first.proc, "exit");
  const orphans = before.services.filter((s) => s.pid && isAlive(s.pid));
  assert.ok(orphans.length > 0, "its services outlive a SIGKILLed supervisor");

  const next = await startTroupe();
  assert.match(next.log(), /an earlier troupe up \(pid \d+\) was killed and left .*running: ended them/);
  for (const s of orphans) assert.ok(!isAlive(s.pid), `${s.service} (pid ${s.pid}) was ended`);
  const now = await containers();
  for (const id of sessionContainers) assert.ok(!now.some((c) => id.startsWith(c)), `container ${id} was removed`);
  assert.match((await chat()).stdout, /left/, "the new stack serves the same session");

  next.proc.kill("SIGTERM");
  const [code] = await once(next.proc, "exit");
  assert.equal(code, 0);
  assert.deepEqual(await containers(), [], "a clean stop removes the stack's sandboxes");
});
