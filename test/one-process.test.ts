// `troupe up --one-process`: every service in one Node process, each on its own port, so the
// chat CLI, `troupe status` and a tool turn through the sandbox work as with five processes; and
// SIGTERM drains them all and leaves no container behind.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import {
  MAIN,
  flagsFor,
  sandboxContainers,
  startUp,
  stopUp,
  type ServiceName,
  type StackAddresses,
} from "./helpers/stack.js";

const run = promisify(execFile);
let dataDir: string;
let addr: StackAddresses;
let up: ChildProcess;
let log: () => string;

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-one-"));
  ({
    proc: up,
    addr,
    log,
  } = await startUp(dataDir, {
    args: ["--one-process"],
    env: { TROUPE_LOG_FORMAT: "text", TROUPE_LOG_LEVEL: "debug", LD_PRELOAD: undefined },
  }));
});

after(async () => {
  await stopUp(up);
  await rm(dataDir, { recursive: true, force: true });
});

const troupe = (...args: string[]) =>
  run(process.execPath, [MAIN, ...args, ...flagsFor(addr, dataDir)], { timeout: 60_000 });

test("every service is this one process, on its own port", async () => {
  const upFile = JSON.parse(await readFile(path.join(dataDir, "up.json"), "utf8")) as {
    supervisor: number;
    services: { service: string; address: string; pid: number }[];
  };
  assert.equal(upFile.supervisor, up.pid);
  const names = upFile.services.map((s) => s.service).sort();
  assert.deepEqual(names, ["gateway", "memory", "model-server", "router", "runner", "sandbox"]);
  for (const s of upFile.services) {
    assert.equal(s.pid, up.pid, `${s.service} runs in troupe up's own process`);
    assert.equal(s.address, addr[s.service as ServiceName]);
  }
  const status = await troupe("status");
  for (const name of ["gateway", "router", "runner", "memory", "sandbox"])
    assert.match(status.stdout, new RegExp(name));
  assert.doesNotMatch(status.stdout, /NOT_SERVING|unreachable/i);
});

test("it runs with jemalloc, as the same process", async () => {
  // up.pid is what the test spawned: the process executed itself again in place.
  const cmdline = (await readFile(`/proc/${up.pid}/cmdline`, "utf8")).split("\0");
  assert.ok(cmdline.includes("--one-process"), cmdline.join(" "));
  assert.match(await readFile(`/proc/${up.pid}/maps`, "utf8"), /libjemalloc\.so\.2/);
});

test("once quiet, the process gives back the heap it grew while starting", async () => {
  // TROUPE_IDLE_TRIM_MS defaults to 5 s of an idle event loop.
  const trim = /all: idle: resident memory ([\d.]+) -> ([\d.]+) MB/;
  const deadline = Date.now() + 30_000;
  while (!trim.test(log()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 250));
  const [, before, after] = trim.exec(log()) ?? assert.fail(`no trim logged:\n${log().slice(-2000)}`);
  assert.ok(Number(after) < Number(before), `${before} -> ${after} MB`);
});

test("a tool turn runs through the sandbox, and the session log is on disk", async () => {
  const { stdout } = await troupe("chat", "--session", "one-1", "$ echo from-one-process");
  assert.match(stdout, /from-one-process/);
  const { stdout: shown } = await troupe("sessions", "show", "one-1");
  assert.match(shown, /user: \$ echo from-one-process/);
});

test("SIGTERM drains every service, removes up.json and leaves no container", async () => {
  up.kill("SIGTERM");
  const [code] = await once(up, "exit");
  assert.equal(code, 0, log());
  assert.match(log(), /all: stopped/);
  await assert.rejects(stat(path.join(dataDir, "up.json")), /ENOENT/);
  assert.deepEqual(await sandboxContainers(dataDir), [], "the sandbox's containers were removed on the way out");
});
