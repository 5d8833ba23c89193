// troupe up starts every service on jemalloc where it is installed (make test installs it): the
// library is mapped in each service's process, with the purging thread's settings in its
// environment. The one-process stack's is checked in one-process.test.ts.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { JEMALLOC_CONF } from "../services/cli/allocator.js";
import { startUp, type Up } from "./helpers/stack.js";

let dataDir: string;
let up: Up;

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-alloc-"));
  up = await startUp(dataDir, { env: { TROUPE_LOG_FORMAT: "text", LD_PRELOAD: undefined, MALLOC_CONF: undefined } });
});

after(async () => {
  if (up.proc.exitCode === null) {
    up.proc.kill("SIGTERM");
    await once(up.proc, "exit");
  }
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
