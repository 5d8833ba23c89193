// Every service runs on jemalloc where it is installed (make test installs it): the library is
// mapped in each service's process, with the purging thread's settings in its environment, both
// under troupe up and when a service is started alone, as the Kubernetes manifests start them.
// The one-process stack's is checked in one-process.test.ts.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { JEMALLOC_CONF } from "../services/cli/allocator.js";
import { MAIN, freePort, startUp, stopUp, waitServing, type Up } from "./helpers/stack.js";

let dataDir: string;
let up: Up;

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-alloc-"));
  up = await startUp(dataDir, { env: { TROUPE_LOG_FORMAT: "text", LD_PRELOAD: undefined, MALLOC_CONF: undefined } });
});

after(async () => {
  await stopUp(up.proc);
  await rm(dataDir, { recursive: true, force: true });
});

test("every service of troupe up maps jemalloc and purges in the background", async () => {
  const { services } = JSON.parse(await readFile(path.join(dataDir, "up.json"), "utf8")) as {
    services: { service: string; pid: number }[];
  };
  assert.equal(services.length, 6, "five services and the scripted model server");
  for (const s of services) {
    const maps = await readFile(`/proc/${s.pid}/maps`, "utf8");
    assert.match(maps, /libjemalloc\.so\.2/, `${s.service} (pid ${s.pid}) runs on jemalloc`);
    const environ = (await readFile(`/proc/${s.pid}/environ`, "utf8")).split("\0");
    assert.ok(environ.includes(`MALLOC_CONF=${JEMALLOC_CONF}`), `${s.service}'s MALLOC_CONF`);
  }
  // The supervisor itself is left on glibc's: it only relays output.
  assert.doesNotMatch(await readFile(`/proc/${up.proc.pid}/maps`, "utf8"), /libjemalloc/);
});

/** `troupe router` started alone with `env`; returns its pid once it serves, and a stop. */
async function routerAlone(env: NodeJS.ProcessEnv): Promise<{ pid: number; stop: () => Promise<void> }> {
  const addr = `127.0.0.1:${await freePort()}`;
  const childEnv: NodeJS.ProcessEnv = { ...process.env, TROUPE_LOG_FORMAT: "text", ...env };
  for (const [name, value] of Object.entries(env)) if (value === undefined) delete childEnv[name];
  const proc = spawn(process.execPath, [MAIN, "router", "--router", addr, "--data-dir", dataDir, "--metrics", "off"], {
    env: childEnv,
    stdio: ["ignore", "ignore", "inherit"],
  });
  await waitServing(addr);
  return {
    pid: proc.pid!,
    stop: async () => {
      proc.kill("SIGTERM");
      await once(proc, "exit");
    },
  };
}

test("a service started alone executes itself again on jemalloc, keeping its pid", async () => {
  const router = await routerAlone({ LD_PRELOAD: undefined, MALLOC_CONF: undefined });
  try {
    // The pid is the one spawned: the process replaced itself rather than starting a child.
    assert.match(await readFile(`/proc/${router.pid}/maps`, "utf8"), /libjemalloc\.so\.2/);
    const environ = (await readFile(`/proc/${router.pid}/environ`, "utf8")).split("\0");
    assert.ok(environ.includes(`MALLOC_CONF=${JEMALLOC_CONF}`), environ.join(" "));
  } finally {
    await router.stop();
  }
});

test("TROUPE_ALLOCATOR=system leaves a service alone on glibc's malloc", async () => {
  const router = await routerAlone({ LD_PRELOAD: undefined, MALLOC_CONF: undefined, TROUPE_ALLOCATOR: "system" });
  try {
    assert.doesNotMatch(await readFile(`/proc/${router.pid}/maps`, "utf8"), /libjemalloc/);
  } finally {
    await router.stop();
  }
});
