// The JSONL session store on real files: creation is atomic, a torn last record is cut off
// before new appends, group-committed appends keep their order, a damaged line in the middle is
// skipped and reported, and sessions are named by their owner as well as their id.
import { test } from "node:test";
import assert from "node:assert/strict";
import { trace } from "@opentelemetry/api";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { appendFile, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { JsonlSessionStore } from "../../services/runner/store/jsonl-session-store.js";
import type { LogRecord } from "../../services/runner/session/session-log.js";
import { fileName, filePart, refOf } from "../../services/shared/session-ref.js";
import { SessionElsewhere } from "../../services/runner/session/session-lease.js";
import { Status } from "../../services/shared/errors.js";

const OWNER = { tenant: "t1", principal: "alice" };
const S1 = refOf(OWNER, "s1");
const S2 = refOf(OWNER, "s2");
const S = refOf(OWNER, "s");
const T = refOf(OWNER, "t");
/** Where the store keeps OWNER's logs. */
const ownerDir = (dir: string) => path.join(dir, "sessions", "t1", "alice");

test("the session log: atomic create, torn tail repaired, appends in order", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-log-"));
  try {
    const store = new JsonlSessionStore(dir);
    const log = await store.create(S1, "main", OWNER);
    await assert.rejects(store.create(S1, "main", OWNER), { code: "EEXIST" });
    await Promise.all(Array.from({ length: 50 }, (_, i) => log.append({ t: "seq", upTo: i }, i % 7 === 0)));
    await log.close();
    let records = await store.read(S1);
    assert.deepEqual(records[0], {
      t: "session",
      sessionId: "s1",
      agentId: "main",
      createdMs: (records[0] as { createdMs: number }).createdMs,
      tenant: "t1",
      principal: "alice",
    });
    assert.deepEqual(records[1], { t: "epoch", epoch: 1, runnerId: store.leases.self.runnerId });
    assert.deepEqual(
      records.slice(2).map((r) => (r as { upTo: number }).upTo),
      Array.from({ length: 50 }, (_, i) => i),
    );

    // A crash mid-write leaves half a record at the end; it was never acknowledged.
    const file = path.join(ownerDir(dir), "s1.jsonl");
    await appendFile(file, '{"t":"seq","up');
    assert.equal((await store.read(S1)).length, 52, "reading ignores the torn tail");
    const { log: again } = await store.activate(S1);
    await again.append({ t: "seq", upTo: 99 }, true);
    await again.close();
    records = await store.read(S1);
    assert.equal((records.at(-1) as { upTo: number }).upTo, 99, "the next record follows the last complete one");
    assert.ok(
      (await readFile(file, "utf8"))
        .split("\n")
        .filter(Boolean)
        .every((l) => JSON.parse(l)),
    );

    // A damaged record in the middle costs that record, not the session: skipped and reported.
    await writeFile(
      path.join(ownerDir(dir), "s2.jsonl"),
      '{"t":"session","sessionId":"s2","agentId":"main","createdMs":1,"tenant":"t1","principal":"alice"}\nnot json\n{"t":"seq","upTo":1}\n',
    );
    assert.deepEqual(
      (await store.read(S2)).map((r) => r.t),
      ["session", "seq"],
    );
    const { log: damaged, records: kept, corruptLines } = await store.activate(S2);
    assert.deepEqual(corruptLines, [2]);
    assert.equal(kept.at(-1)?.t, "epoch", "the session takes appends after the damaged line");
    await damaged.close();
    assert.deepEqual(
      (await readdir(ownerDir(dir))).filter((n) => n.endsWith(".tmp")),
      [],
      "no temporary files left",
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("records appended in one turn of the event loop are written together, in order", async () => {
  // Each write of the log is one "append session log" span; its attribute counts the records.
  const exporter = new InMemorySpanExporter();
  trace.setGlobalTracerProvider(new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] }));
  const batches = () =>
    exporter
      .getFinishedSpans()
      .map((s) => ({ records: s.attributes["troupe.store.records"], sync: s.attributes["troupe.store.sync"] }));
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-log-"));
  try {
    const store = new JsonlSessionStore(dir);
    const log = await store.create(S1, "main", OWNER);
    await log.append({ t: "seq", upTo: 99 }, false); // the log's file is open from here on
    exporter.reset();
    // Five records in one stretch of code, the last synced: one write, one fsync.
    await Promise.all(Array.from({ length: 5 }, (_, i) => log.append({ t: "seq", upTo: 100 + i }, i === 4)));
    assert.deepEqual(batches(), [{ records: 5, sync: true }]);
    // A record appended while the sync is in flight waits for it and goes in the next write.
    exporter.reset();
    const synced = log.append({ t: "seq", upTo: 200 }, true);
    await new Promise((resolve) => setImmediate(resolve));
    const late = log.append({ t: "seq", upTo: 201 }, false);
    await Promise.all([synced, late]);
    assert.deepEqual(batches(), [
      { records: 1, sync: true },
      { records: 1, sync: false },
    ]);
    await log.close();
    assert.deepEqual(
      (await store.read(S1)).slice(2).map((r) => (r as { upTo: number }).upTo),
      [99, 100, 101, 102, 103, 104, 200, 201],
    );
  } finally {
    trace.disable();
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
    const logA = await a.create(S, "main", OWNER);
    await logA.append({ t: "seq", upTo: 1 }, true);

    // A is alive (fresh heartbeat): B's activation is refused, and leaves no trace in the log.
    await assert.rejects(b.activate(S), (err: unknown) => {
      assert.ok(err instanceof SessionElsewhere);
      assert.equal(err.code, Status.ABORTED);
      assert.equal(err.ownerAddress, "a:1");
      assert.match(err.message, /live on runner a/);
      return true;
    });
    await assert.rejects(b.create(S, "main", OWNER), { code: "EEXIST" });
    assert.deepEqual(epochs(await b.read(S)), [1]);
    await logA.append({ t: "seq", upTo: 2 }, true);

    // A restarts after a crash (same runner id, new incarnation): its old lease is dead at once,
    // and the next activation takes the session. The old A process, still writing, is fenced.
    await storeFor("a", "a-2");
    const { log: logB, records } = await b.activate(S);
    assert.deepEqual(epochs(records), [1, 2]);
    assert.deepEqual(seqs(records), [1, 2], "everything the old owner acknowledged is there");
    await assert.rejects(logA.append({ t: "seq", upTo: 3 }, true), SessionElsewhere);
    await assert.rejects(
      logA.append({ t: "seq", upTo: 4 }),
      SessionElsewhere,
      "a fenced log refuses every later append",
    );
    await logB.append({ t: "seq", upTo: 10 }, true);
    const raw = await readFile(path.join(ownerDir(dir), "s.jsonl"), "utf8");
    assert.match(raw, /"upTo":3/, "the stale write reached the file...");
    assert.deepEqual(seqs(await b.read(S)), [1, 2, 10], "...but readers leave it out");
    await logA.close(); // a fenced log does not release what it no longer holds
    await assert.rejects(a.activate(S), SessionElsewhere, "B holds the session");

    // A clean close releases the lease: the next activation anywhere takes the next epoch.
    await logB.close();
    const { log: again, records: after } = await a.activate(S);
    assert.deepEqual(epochs(after), [1, 2, 3]);
    await again.close();
    const leftovers = (await readdir(ownerDir(dir))).filter((n) => n !== "s.jsonl");
    assert.deepEqual(leftovers, [], "no lease or temporary files left after clean closes");

    // A runner that stops cleanly removes its heartbeat: its leases are dead at once.
    const c = await storeFor("c", "c-1");
    await c.create(T, "main", OWNER);
    await c.stop();
    const { log: taken } = await b.activate(T);
    await taken.close();
  } finally {
    for (const s of stores) await s.stop();
    await rm(dir, { recursive: true, force: true });
  }
});

test("a restarted runner takes back its sessions before its new heartbeat replaces the old one", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-lease-"));
  const first = new JsonlSessionStore(dir, { runnerId: "r", address: "r:1", incarnation: "r-1" }, 60_000);
  await first.start();
  try {
    const log = await first.create(S, "main", OWNER);
    await log.append({ t: "seq", upTo: 1 }, true);
    // Another runner is refused while r-1's heartbeat is fresh.
    const other = new JsonlSessionStore(dir, { runnerId: "q", address: "q:1", incarnation: "q-1" }, 60_000);
    await assert.rejects(other.activate(S), SessionElsewhere);
    // The same runner at the same address, a new process that has not yet beaten: r-1's
    // heartbeat is still fresh, but r-1 cannot be running, for r-2 holds its address.
    const restarted = new JsonlSessionStore(dir, { runnerId: "r", address: "r:1", incarnation: "r-2" }, 60_000);
    const { log: taken, records } = await restarted.activate(S);
    assert.deepEqual(
      records.flatMap((r) => (r.t === "seq" ? [r.upTo] : [])),
      [1],
    );
    await taken.close();
  } finally {
    await first.stop();
    await rm(dir, { recursive: true, force: true });
  }
});

test("sessions are named by owner and id: look-alike ids and other owners never share a log", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-refs-"));
  try {
    const store = new JsonlSessionStore(dir);
    await store.start();
    // The names that collided when ':' became '_' (a tenant's schedules reached another's).
    const a = { tenant: "acme", principal: "alice" };
    const b = { tenant: "evil", principal: "bob" };
    await (await store.create(refOf(a, "agent:x:main"), "main", a)).close();
    assert.equal(
      await store.exists(refOf(b, "agent:x:main")),
      false,
      "another tenant's same id is another (missing) session",
    );
    assert.equal(await store.exists(refOf(a, "agent_x_main")), false, "a look-alike id is another session");
    await (await store.create(refOf(b, "agent:x:main"), "main", b)).close();
    await (await store.create(refOf(a, "agent_x_main"), "main", a)).close();
    assert.deepEqual((await store.list(a)).map((s) => s.sessionId).sort(), ["agent:x:main", "agent_x_main"]);
    assert.deepEqual(
      (await store.list(b)).map((s) => s.sessionId),
      ["agent:x:main"],
    );
    // A principal named like a tenant/principal pair never reaches the pair's folder.
    assert.notEqual(fileName("a.b", "c"), fileName("a", "b.c"));
    assert.notEqual(filePart("x:y"), filePart("x_y"));
    assert.notEqual(filePart("x_3ay"), filePart("x:y"));
    for (const id of ["", ".", "..", "a/b", "\u00e9"]) assert.match(filePart(id), /^[A-Za-z0-9_-]+$/, id);
    const long = "a".repeat(100) + ":".repeat(20);
    assert.notEqual(filePart(long), filePart(`${long}:`));
    assert.ok(filePart(long).length < 100);
    // A log whose header names another owner (copied or moved by hand) is not served as this one.
    await writeFile(
      path.join(dir, "sessions", "acme", "alice", "forged.jsonl"),
      '{"t":"session","sessionId":"forged","agentId":"main","createdMs":1,"tenant":"evil","principal":"bob"}\n',
    );
    assert.equal(await store.exists(refOf(a, "forged")), false);
    await assert.rejects(store.read(refOf(a, "forged")), { code: "ENOENT" });
    await store.stop();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("logs of the flat layout move under their owner when the store starts", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-migrate-"));
  try {
    await mkdir(path.join(dir, "sessions"), { recursive: true });
    await writeFile(
      path.join(dir, "sessions", "old.jsonl"),
      '{"t":"session","sessionId":"old","agentId":"main","createdMs":1,"tenant":"t1","principal":"alice"}\n{"e":1,"t":"epoch","epoch":1,"runnerId":"r"}\n',
    );
    await writeFile(path.join(dir, "sessions", "old.lease.1"), "{}");
    await writeFile(
      path.join(dir, "sessions", "legacy.jsonl"),
      '{"t":"session","sessionId":"legacy","agentId":"main","createdMs":1}\n',
    );
    const store = new JsonlSessionStore(dir);
    await store.start();
    assert.equal(await store.exists(S), false);
    assert.ok(await store.exists(refOf(OWNER, "old")));
    assert.ok(
      await store.exists(refOf({ tenant: "local", principal: "dev" }, "legacy")),
      "a log from before owners belongs to the development identity",
    );
    const { log, records } = await store.activate(refOf(OWNER, "old"));
    assert.deepEqual(
      records.filter((r) => r.t === "epoch").map((r) => (r as { epoch: number }).epoch),
      [1, 2],
    );
    await log.close();
    assert.deepEqual((await readdir(path.join(dir, "sessions"))).sort(), ["local", "t1"]);
    await store.stop();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
