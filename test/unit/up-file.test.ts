// up.json is rewritten as each child starts, and children start concurrently. A CI run once read
// a null pid for a service that was running: an older picture of the stack had been written last.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { upFileWriter, type UpFile } from "../../services/cli/up/file.js";

const SERVICES = ["router", "memory", "sandbox", "runner", "gateway"];

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-up-file-"));
  try {
    await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test("writes fired together leave the newest state, and a reader never sees half a file", () =>
  withDir(async (dir) => {
    const file = path.join(dir, "up.json");
    const pids: (number | null)[] = SERVICES.map(() => null);
    const state = (): UpFile => ({
      supervisor: 1,
      services: SERVICES.map((service, i) => ({ service, pid: pids[i] })),
    });
    const writer = upFileWriter(file, state, (err) => assert.fail(err));
    let reading = true;
    let reads = 0;
    const reader = (async () => {
      while (reading) {
        const text = await readFile(file, "utf8").catch(() => undefined);
        if (text === undefined) continue;
        assert.doesNotThrow(() => JSON.parse(text), `a whole file, not ${JSON.stringify(text.slice(0, 40))}`);
        reads++;
      }
    })();
    // Each child starts and asks for a write, without waiting for the last: as `troupe up` does.
    const writes: Promise<void>[] = [];
    for (let round = 0; round < 20; round++)
      for (let i = 0; i < SERVICES.length; i++) {
        pids[i] = 1000 * round + i + 1;
        writes.push(writer.write());
      }
    await Promise.all(writes);
    reading = false;
    await reader;
    const written = JSON.parse(await readFile(file, "utf8")) as UpFile;
    assert.deepEqual(written, state());
    assert.ok(reads > 0, "the reader read the file while it was written");
    assert.deepEqual((await readdir(dir)).sort(), ["up.json"], "no temporary file is left");
  }));

test("a write resolves only once the state as of its call is on disk", () =>
  withDir(async (dir) => {
    const file = path.join(dir, "up.json");
    let pid = 1;
    const writer = upFileWriter(file, () => ({ supervisor: 1, services: [{ service: "runner", pid }] }), assert.fail);
    const first = writer.write();
    pid = 2;
    await writer.write();
    assert.equal((JSON.parse(await readFile(file, "utf8")) as UpFile).services[0].pid, 2);
    await first;
  }));

test("remove waits for writes under way and later writes do not bring the file back", () =>
  withDir(async (dir) => {
    const file = path.join(dir, "up.json");
    const writer = upFileWriter(file, () => ({ supervisor: 1, services: [] }), assert.fail);
    void writer.write();
    void writer.write();
    await writer.remove();
    await writer.write();
    assert.deepEqual(await readdir(dir), []);
  }));

test("a write that fails is reported, and the next one still writes", () =>
  withDir(async (dir) => {
    const file = path.join(dir, "missing", "up.json");
    const errors: string[] = [];
    const writer = upFileWriter(
      file,
      () => ({ supervisor: 1, services: [] }),
      (err) => errors.push(err.message),
    );
    await writer.write();
    assert.equal(errors.length, 1);
    assert.match(errors[0], /ENOENT/);
    await mkdir(path.dirname(file));
    await writer.write();
    assert.equal(errors.length, 1);
    assert.deepEqual(JSON.parse(await readFile(file, "utf8")), { supervisor: 1, services: [] });
  }));
