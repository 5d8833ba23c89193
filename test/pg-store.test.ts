// The PostgreSQL store against a real server (Debian's postgresql, started by the test on a free
// port): the storage contract every store keeps, then what only a shared database can prove:
// fencing by epoch in the database, leases that lapse with the heartbeat, migrations applied once
// however many processes start together, and group commit across sessions.
import { describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { PgSessionStore } from "../services/runner/store/pg-session-store.js";
import { SessionElsewhere } from "../services/runner/session/session-lease.js";
import { pgStorage } from "../services/runner/store/storage.js";
import { RunnerHeartbeat, liveRunners } from "../services/shared/membership.js";
import { MIGRATIONS, migrate, openPool, schemaVersion } from "../services/shared/pg.js";
import { refOf } from "../services/shared/session-ref.js";
import { freshDatabase } from "./helpers/postgres.js";
import { orphansContract, storageContract } from "./helpers/storage-contract.js";

const ALICE = { tenant: "t1", principal: "alice" };
const runner = (id: string) => ({ runnerId: id, address: `127.0.0.1:${id.length}`, incarnation: randomUUID() });

storageContract("postgres", async () => pgStorage(await freshDatabase(), runner("r1"), 10_000, () => undefined));

/** A database with the schema, and a runner (membership row and session store) on it. */
async function member(url: string, id: string, livenessMs: number) {
  const pool = openPool(url);
  await migrate(pool);
  const self = runner(id);
  const heartbeat = new RunnerHeartbeat(pool, self, livenessMs);
  await heartbeat.start();
  return { pool, self, heartbeat, store: new PgSessionStore(pool, self, livenessMs) };
}

/** Two runners on one new database, stopped and closed when the test ends. */
async function twoRunners(t: TestContext, livenessMs: number) {
  const url = await freshDatabase();
  const a = await member(url, "ra", livenessMs);
  const b = await member(url, "rb", livenessMs);
  t.after(async () => {
    for (const m of [a, b]) {
      await m.heartbeat.stop();
      await m.pool.end();
    }
  });
  return { a, b };
}

describe("fencing in the database", () => {
  test("a live owner's session is refused to others; once its beat lapses the new owner fences its writes", async (t) => {
    const { a, b } = await twoRunners(t, 600);
    const ref = refOf(ALICE, "s1");
    const logA = await a.store.create(ref, "main", ALICE);
    await logA.append({ t: "settings", queueMode: 1 }, true);

    // While A beats, B may not take the session, and is told where it lives.
    const refused = await b.store.activate(ref).catch((e: unknown) => e);
    assert.ok(refused instanceof SessionElsewhere, String(refused));
    assert.equal(refused.ownerAddress, a.self.address);

    // A stops beating (a SIGSTOPped process): after the liveness period B takes over.
    await a.heartbeat.stop().catch(() => undefined);
    await a.pool.query(
      "INSERT INTO troupe_runners (runner_id, address, incarnation, host, pid, beat_at) VALUES ($1, $2, $3, 'h', 1, now() - interval '1 hour')",
      [a.self.runnerId, a.self.address, a.self.incarnation],
    );
    const { log: logB, records } = await b.store.activate(ref);
    assert.deepEqual(
      records.filter((r) => r.t === "settings"),
      [{ t: "settings", queueMode: 1 }],
    );
    await logB.append({ t: "settings", queueMode: 2 }, true);

    // A resumes and writes: refused by the database, and nothing of it is stored.
    const late = await logA.append({ t: "settings", queueMode: 3 }, true).catch((e: unknown) => e);
    assert.ok(late instanceof SessionElsewhere, `a fenced write is refused, got ${String(late)}`);
    const again = await logA.append({ t: "settings", queueMode: 4 }).catch((e: unknown) => e);
    assert.ok(again instanceof SessionElsewhere, "and every write after it");
    const stored = (await b.store.read(ref)).filter((r) => r.t === "settings");
    assert.deepEqual(stored, [
      { t: "settings", queueMode: 1 },
      { t: "settings", queueMode: 2 },
    ]);
    const { rows } = await b.pool.query(
      "SELECT count(*)::int AS n FROM troupe_records WHERE record LIKE '%\"queueMode\":3%'",
    );
    assert.equal(rows[0].n, 0, "the late record is not in the table at all");
    await logB.close();
  });

  test("a restarted runner takes back its sessions before its new membership row replaces the old", async (t) => {
    const { a } = await twoRunners(t, 60_000);
    const ref = refOf(ALICE, "s-restart");
    await a.store.create(ref, "main", ALICE);
    // The same runner id at the same address, a new process that has not yet beaten: the row
    // still says the old incarnation is alive, but it cannot be, for this one holds its address.
    const restarted = new PgSessionStore(a.pool, { ...a.self, incarnation: randomUUID() }, 60_000);
    const { log, records } = await restarted.activate(ref);
    assert.deepEqual(
      records.filter((r) => r.t === "epoch").map((r) => (r as { epoch: number }).epoch),
      [1, 2],
    );
    await log.close();
  });

  test("a session whose holder is gone is an orphan to every runner", async (t) => {
    const pool = openPool(await freshDatabase());
    await migrate(pool);
    const beats: RunnerHeartbeat[] = [];
    t.after(async () => {
      for (const b of beats) await b.stop();
      await pool.end();
    });
    const runnerOf = (self: ReturnType<typeof runner>) => {
      const heartbeat = new RunnerHeartbeat(pool, self, 60_000);
      beats.push(heartbeat);
      return {
        store: new PgSessionStore(pool, self, 60_000),
        start: () => heartbeat.start(),
        kill: () => heartbeat.stop(),
      };
    };
    const self = runner("ra");
    await orphansContract({
      first: runnerOf(self),
      restarted: runnerOf({ ...self, incarnation: randomUUID() }),
      another: runnerOf(runner("rb")),
    });
  });

  test("a closed log releases its lease: another runner takes the session at once", async (t) => {
    const { a, b } = await twoRunners(t, 60_000);
    const ref = refOf(ALICE, "s2");
    await (await a.store.create(ref, "main", ALICE)).close();
    const { log, records } = await b.store.activate(ref);
    assert.deepEqual(
      records.filter((r) => r.t === "epoch").map((r) => (r as { epoch: number }).epoch),
      [1, 2],
    );
    await log.close();
  });

  test("a stopped runner's sessions move at once; a draining runner is not offered new ones", async (t) => {
    const { a, b } = await twoRunners(t, 60_000);
    assert.deepEqual(
      (await liveRunners(a.pool, 60_000)).map((r) => r.runnerId),
      ["ra", "rb"],
    );
    await b.heartbeat.drain();
    assert.deepEqual(
      (await liveRunners(a.pool, 60_000)).map((r) => r.runnerId),
      ["ra"],
    );
    const ref = refOf(ALICE, "s3");
    await a.store.create(ref, "main", ALICE); // never closed: A dies holding it
    await a.heartbeat.stop();
    const { log } = await b.store.activate(ref);
    await log.close();
  });
});

describe("migrations", () => {
  test("many processes starting together apply each migration once", async () => {
    const url = await freshDatabase();
    const pools = Array.from({ length: 4 }, () => openPool(url, 2));
    try {
      const applied = await Promise.all(pools.map((p) => migrate(p)));
      assert.deepEqual(
        applied.flat().sort(),
        MIGRATIONS.map((_, i) => i + 1),
      );
      assert.equal(await schemaVersion(pools[0]), MIGRATIONS.length);
      assert.deepEqual(await migrate(pools[0]), [], "nothing is due the second time");
    } finally {
      await Promise.all(pools.map((p) => p.end()));
    }
  });

  test("a database ahead of this build is refused, not written", async () => {
    const url = await freshDatabase();
    const pool = openPool(url, 2);
    try {
      await migrate(pool);
      await pool.query("INSERT INTO troupe_schema (version) VALUES ($1)", [MIGRATIONS.length + 1]);
      await assert.rejects(
        migrate(pool),
        /schema is at version \d+ but this build knows only up to \d+; upgrade Troupe/,
      );
    } finally {
      await pool.end();
    }
  });

  test("an unreachable store fails the start with a clear error", async () => {
    const storage = pgStorage("postgres://troupe@127.0.0.1:1/troupe", runner("r1"), 1000, () => undefined);
    await assert.rejects(storage.start(), /ECONNREFUSED/);
    await storage.stop();
  });
});

describe("group commit", () => {
  test("appends of many sessions share statements and keep each session's order", async (t) => {
    const url = await freshDatabase();
    const a = await member(url, "ra", 60_000);
    t.after(async () => {
      await a.heartbeat.stop();
      await a.pool.end();
    });
    const logs = await Promise.all(
      Array.from({ length: 100 }, (_, i) => a.store.create(refOf(ALICE, `g${i}`), "main", ALICE)),
    );
    const before = { ...a.store.appender.stats };
    await Promise.all(
      logs.flatMap((log) => Array.from({ length: 20 }, (_, n) => log.append({ t: "seq", upTo: n }, n === 19))),
    );
    const batches = a.store.appender.stats.batches - before.batches;
    assert.equal(a.store.appender.stats.records - before.records, 2000);
    assert.ok(batches < 100, `2,000 appends took ${batches} statements`);
    for (const i of [0, 57, 99]) {
      const seqs = (await a.store.read(refOf(ALICE, `g${i}`)))
        .filter((r) => r.t === "seq")
        .map((r) => (r as { upTo: number }).upTo);
      assert.deepEqual(
        seqs,
        Array.from({ length: 20 }, (_, n) => n),
      );
    }
    await Promise.all(logs.map((l) => l.close()));
  });
});

describe("batched activation", () => {
  test("a dead runner's sessions are claimed many to a statement; each gets its epoch, records and answer", async (t) => {
    const { a, b } = await twoRunners(t, 60_000);
    const refs = Array.from({ length: 60 }, (_, i) => refOf(ALICE, `m${i}`));
    for (const ref of refs) {
      const log = await a.store.create(ref, "main", ALICE);
      await log.append({ t: "settings", queueMode: 1 }, true);
    }
    // B keeps one session live; A dies (its beat an hour old) holding the rest.
    const live = refOf(ALICE, "held-by-b");
    const held = await b.store.create(live, "main", ALICE);
    await a.heartbeat.stop().catch(() => undefined);
    await a.pool.query(
      "INSERT INTO troupe_runners (runner_id, address, incarnation, host, pid, beat_at) VALUES ($1, $2, $3, 'h', 1, now() - interval '1 hour')",
      [a.self.runnerId, a.self.address, a.self.incarnation],
    );

    const c = await member(a.pool.options.connectionString!, "rc", 60_000);
    t.after(async () => {
      await c.heartbeat.stop();
      await c.pool.end();
    });
    const before = { ...c.store.activations.stats };
    const answers = await Promise.allSettled([
      ...refs.map((ref) => c.store.activate(ref)),
      c.store.activate(live),
      c.store.activate(refOf(ALICE, "never-made")),
      c.store.activate(refOf({ tenant: "t2", principal: "alice" }, "m1")),
    ]);
    const batches = c.store.activations.stats.batches - before.batches;
    assert.ok(batches <= 3, `${refs.length + 3} activations took ${batches} batches`);

    for (const [i, got] of answers.slice(0, refs.length).entries()) {
      assert.equal(got.status, "fulfilled", `session m${i}: ${got.status === "rejected" ? got.reason : ""}`);
      const { log, records } = (got as PromiseFulfilledResult<Awaited<ReturnType<typeof c.store.activate>>>).value;
      assert.deepEqual(
        records.map((r) => r.t),
        ["session", "epoch", "settings", "epoch"],
      );
      assert.equal((records.at(-1) as { epoch: number }).epoch, 2);
      // The log goes on after the epoch record, and a reader sees it all in order.
      await log.append({ t: "settings", queueMode: 5 }, true);
      const stored = await c.store.read(refs[i]);
      assert.deepEqual(
        stored.map((r) => r.t),
        ["session", "epoch", "settings", "epoch", "settings"],
      );
    }
    // The live one is refused with its owner's address; a missing one and another tenant's are ENOENT alike.
    const [liveAnswer, missing, foreign] = answers.slice(refs.length);
    assert.equal(liveAnswer.status, "rejected");
    assert.ok((liveAnswer as PromiseRejectedResult).reason instanceof SessionElsewhere);
    assert.equal(((liveAnswer as PromiseRejectedResult).reason as SessionElsewhere).ownerAddress, b.self.address);
    for (const r of [missing, foreign]) {
      assert.equal(r.status, "rejected");
      assert.equal(((r as PromiseRejectedResult).reason as { code?: string }).code, "ENOENT");
    }
    // A's late write is fenced; B's session is B's still.
    await held.append({ t: "settings", queueMode: 7 }, true);
    await held.close();
  });

  test("two runners claiming the same sessions at once: each session goes to exactly one", async (t) => {
    const { a, b } = await twoRunners(t, 60_000);
    const refs = Array.from({ length: 40 }, (_, i) => refOf(ALICE, `r${i}`));
    const dead = await member(a.pool.options.connectionString!, "dead", 60_000);
    for (const ref of refs) await dead.store.create(ref, "main", ALICE);
    await dead.heartbeat.stop().catch(() => undefined);
    await dead.pool.end();
    const [fromA, fromB] = await Promise.all(
      [a, b].map((m) => Promise.allSettled(refs.map((ref) => m.store.activate(ref)))),
    );
    for (const [i, ref] of refs.entries()) {
      const won = [fromA[i], fromB[i]].filter((r) => r.status === "fulfilled");
      assert.equal(won.length, 1, `session ${ref.sessionId} taken by ${won.length} runners`);
      const lost = [fromA[i], fromB[i]].find((r) => r.status === "rejected") as PromiseRejectedResult;
      assert.ok(lost.reason instanceof SessionElsewhere, String(lost.reason));
      const epochs = (await a.store.read(ref)).filter((r) => r.t === "epoch");
      assert.equal(epochs.length, 2, "one epoch record for the one activation");
    }
  });
});
