// The JSONL session store on real files: creation is atomic, a torn last record is cut off
// before new appends, group-committed appends keep their order.
import { test } from "node:test";
import assert from "node:assert/strict";
import { appendFile, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { JsonlSessionStore } from "../services/runner/session-log.js";

test("the session log: atomic create, torn tail repaired, appends in order", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-log-"));
  try {
    const store = new JsonlSessionStore(dir);
    const log = await store.create("s1", "main");
    await assert.rejects(store.create("s1", "main"), { code: "EEXIST" });
    await Promise.all(Array.from({ length: 50 }, (_, i) => log.append({ t: "seq", upTo: i }, i % 7 === 0)));
    await log.close();
    let records = await store.read("s1");
    assert.deepEqual(records[0], { t: "session", sessionId: "s1", agentId: "main", createdMs: (records[0] as { createdMs: number }).createdMs });
    assert.deepEqual(records.slice(1).map((r) => (r as { upTo: number }).upTo), Array.from({ length: 50 }, (_, i) => i));

    // A crash mid-write leaves half a record at the end; it was never acknowledged.
    const file = path.join(dir, "sessions", "s1.jsonl");
    await appendFile(file, '{"t":"seq","up');
    assert.equal((await store.read("s1")).length, 51, "reading ignores the torn tail");
    const again = await store.open("s1");
    await again.append({ t: "seq", upTo: 99 }, true);
    await again.close();
    records = await store.read("s1");
    assert.equal((records.at(-1) as { upTo: number }).upTo, 99, "the next record follows the last complete one");
    assert.ok((await readFile(file, "utf8")).split("\n").filter(Boolean).every((l) => JSON.parse(l)));

    // A corrupt record in the middle is not silently skipped.
    await writeFile(path.join(dir, "sessions", "s2.jsonl"), '{"t":"session","sessionId":"s2","agentId":"main","createdMs":1}\nnot json\n{"t":"seq","upTo":1}\n');
    await assert.rejects(store.read("s2"), /corrupt at line 2/);
    assert.deepEqual((await readdir(path.join(dir, "sessions"))).filter((n) => n.endsWith(".tmp")), [], "no temporary files left");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
