// The JSONL session store on real files: creation is atomic, a torn last record is cut off
// before new appends, group-committed appends keep their order.
import { test } from "node:test";
import assert from "node:assert/strict";
import { appendFile, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { JsonlSessionStore, type LogRecord } from "../services/runner/session-log.js";
import { SessionElsewhere } from "../services/runner/session-lease.js";
import { Status } from "../services/shared/errors.js";

const OWNER = { tenant: "t1", principal: "alice" };

test("the session log: atomic create, torn tail repaired, appends in order", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-log-"));
  try {
    const store = new JsonlSessionStore(dir);
    const log = await store.create("s1", "main", OWNER);
    await assert.rejects(store.create("s1", "main", OWNER), { code: "EEXIST" });
    await Promise.all(Array.from({ length: 50 }, (_, i) => log.append({ t: "seq", upTo: i }, i % 7 === 0)));
    await log.close();
    let records = await store.read("s1");
    assert.deepEqual(records[0], { t: "session", sessionId: "s1", agentId: "main", createdMs: (records[0] as { createdMs: number }).createdMs, tenant: "t1", principal: "alice" });
    assert.deepEqual(records[1], { t: "epoch", epoch: 1, runnerId: store.leases.self.runnerId });
    assert.deepEqual(records.slice(2).map((r) => (r as { upTo: number }).upTo), Array.from({ length: 50 }, (_, i) => i));

    // A crash mid-write leaves half a record at the end; it was never acknowledged.
    const file = path.join(dir, "sessions", "s1.jsonl");
    await appendFile(file, '{"t":"seq","up');
    assert.equal((await store.read("s1")).length, 52, "reading ignores the torn tail");
    const { log: again } = await store.activate("s1");
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

test("session leases: a live owner's session is refused; a dead owner's is taken over and its late writes are void", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-lease-"));
  const stores: JsonlSessionStore[] = [];
  const storeFor = async (runnerId: string, incarnation: string) => {
    const s = new JsonlSessionStore(dir, { runnerId, address: `${runnerId}:1`, incarnation }, 60_000);
    await s.start();
    stores.push(s);
    return s;
  };
  const epochs = (records: LogRecord[]) => records.flatMap((r) => (r.t === "epoch" ? [r.epoch] : []));
  const seqs = (records: LogRecord[]) => records.flatMap((r) => (r.t === "seq" ? [r.upTo] : []));
  try {
    const a = await storeFor("a", "a-1");
    const b = await storeFor("b", "b-1");
    const logA = await a.create("s", "main", OWNER);
    await logA.append({ t: "seq", upTo: 1 }, true);

    // A is alive (fresh heartbeat): B's activation is refused, and leaves no trace in the log.
    await assert.rejects(b.activate("s"), (err: unknown) => {
      assert.ok(err instanceof SessionElsewhere);
      assert.equal(err.code, Status.ABORTED);
      assert.equal(err.ownerAddress, "a:1");
      assert.match(err.message, /live on runner a/);
      return true;
    });
    await assert.rejects(b.create("s", "main", OWNER), { code: "EEXIST" });
    assert.deepEqual(epochs(await b.read("s")), [1]);
    await logA.append({ t: "seq", upTo: 2 }, true);

    // A restarts after a crash (same runner id, new incarnation): its old lease is dead at once,
    // and the next activation takes the session. The old A process, still writing, is fenced.
    await storeFor("a", "a-2");
    const { log: logB, records } = await b.activate("s");
    assert.deepEqual(epochs(records), [1, 2]);
    assert.deepEqual(seqs(records), [1, 2], "everything the old owner acknowledged is there");
    await assert.rejects(logA.append({ t: "seq", upTo: 3 }, true), SessionElsewhere);
    await assert.rejects(logA.append({ t: "seq", upTo: 4 }), SessionElsewhere, "a fenced log refuses every later append");
    await logB.append({ t: "seq", upTo: 10 }, true);
    const raw = await readFile(path.join(dir, "sessions", "s.jsonl"), "utf8");
    assert.match(raw, /"upTo":3/, "the stale write reached the file...");
    assert.deepEqual(seqs(await b.read("s")), [1, 2, 10], "...but readers leave it out");
    await logA.close(); // a fenced log does not release what it no longer holds
    await assert.rejects(a.activate("s"), SessionElsewhere, "B holds the session");

    // A clean close releases the lease: the next activation anywhere takes the next epoch.
    await logB.close();
    const { log: again, records: after } = await a.activate("s");
    assert.deepEqual(epochs(after), [1, 2, 3]);
    await again.close();
    const leftovers = (await readdir(path.join(dir, "sessions"))).filter((n) => n !== "s.jsonl");
    assert.deepEqual(leftovers, [], "no lease or temporary files left after clean closes");

    // A runner that stops cleanly removes its heartbeat: its leases are dead at once.
    const c = await storeFor("c", "c-1");
    await c.create("t", "main", OWNER);
    await c.stop();
    const { log: taken } = await b.activate("t");
    await taken.close();
  } finally {
    for (const s of stores) await s.stop();
    await rm(dir, { recursive: true, force: true });
  }
});
