// The memory store's large-table paths on real LanceDB files, at sizes made small by tuning: the
// rewrite in scope order (with writes racing it, nothing may be lost), a search's rows read at
// their addresses, and the vector index serving scoped searches with the recall of exact search.
// The pure parts (rows to Arrow columns, the plan a watch decides) are in test/unit/memory-rows.test.ts.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, open, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import * as lancedb from "@lancedb/lancedb";
import { partitionsFor } from "../services/memory/search-plan.js";
import { FILE_FORMAT, activeTable, cachedBytes, connectMemoryDb, TABLE } from "../services/memory/meta.js";
import {
  MEMORY_COLUMNS,
  memoryArrow,
  newMemoryRow,
  schemaFor,
  sqlString,
  type MemoryRow,
  type StoredMemory,
} from "../services/memory/memory-schema.js";
import { MemoryStore } from "../services/memory/store.js";
import { createLogger, type Logger } from "../services/shared/process/log.js";

const DIM = 32;
const EMBEDDER = "test-synthetic";
const logger = createLogger("test", "error");

function rng(seed: number) {
  let s = seed >>> 0;
  return () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
}
const rand = rng(7);
const gauss = () => Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand());
const unit = (v: Float32Array) => {
  const n = Math.hypot(...v);
  return v.map((x) => x / n);
};
const centres = Array.from({ length: 24 }, () => unit(Float32Array.from({ length: DIM }, gauss)));
const around = (topic: number, spread: number) => unit(centres[topic].map((c) => c + spread * gauss()));
const owners = ["ana", "ben", "cat", "dan"];
const scope = (owner: string) => `tenant = 't' AND owner = ${sqlString(owner)} AND agent_id = 'main'`;

function memory(i: number, owner: string): MemoryRow {
  const topic = i % centres.length;
  return newMemoryRow({
    id: `m${i}`,
    tenant: "t",
    owner,
    agent_id: "main",
    text: `memory ${i} on topic ${topic} of ${owner}`,
    vector: around(topic, 0.3),
    embedder: EMBEDDER,
  });
}

/** The Lance file format of each of a table's data files ("2.1"), from the footer: major, minor (u16 LE), "LANC". */
async function fileFormats(dir: string, table: string): Promise<Set<string>> {
  const data = path.join(dir, `${table}.lance`, "data");
  const formats = new Set<string>();
  for (const name of await readdir(data)) {
    const file = await open(path.join(data, name));
    try {
      const { size } = await file.stat();
      const footer = Buffer.alloc(8);
      await file.read(footer, 0, 8, size - 8);
      assert.equal(footer.toString("latin1", 4), "LANC", `${name} ends as a Lance file`);
      formats.add(`${footer.readUInt16LE(0)}.${footer.readUInt16LE(2)}`);
    } finally {
      await file.close();
    }
  }
  return formats;
}

describe("the memory store past its index threshold", () => {
  let dir: string;
  let store: MemoryStore;
  const ROWS = 6000;
  const TUNING = { indexThreshold: 4000, exactScopeRows: 500 };
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-store-"));
    store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger, TUNING);
    // Owners interleaved, as many users' writes arrive.
    for (let start = 0; start < ROWS; start += 500) {
      const rows = Array.from({ length: 500 }, (_, j) => memory(start + j, owners[(start + j) % owners.length]));
      await store.add("tenant = 't'", rows, new Set());
    }
  });
  after(async () => {
    store?.close();
    await rm(dir, { recursive: true, force: true });
  });

  test("the rewrite in scope order loses nothing written while it copies, and moves the table in use", async () => {
    const db = await lancedb.connect(dir);
    assert.equal(await activeTable(db), TABLE);
    // LanceDB's default format makes reading whole rows several times slower (FILE_FORMAT).
    assert.deepEqual(
      await fileFormats(dir, TABLE),
      new Set([FILE_FORMAT]),
      "the table the store made is in the store's file format",
    );
    // A run started by the writes (which skips the large-table work while writes go on), then an
    // operator's "now": the second must not merely join the first.
    const byWrites = store.maintain({ vectorIndex: "when idle" });
    const maintenance = store.maintain();
    await byWrites;
    // Writes racing the rewrite: new memories, an update, a delete. Some land before the copy's
    // snapshot, the rest are carried over at the switch; either way all of them must show after.
    let extra = 0;
    let racing = true;
    void maintenance.finally(() => (racing = false));
    const raced: Promise<unknown>[] = [];
    raced.push(
      store.add(
        scope("ana"),
        [{ ...memory(0, "ana"), text: "ana's memory 0, updated while the table was rewritten" }],
        new Set(["m0"]),
      ),
    );
    raced.push(store.forget(scope("ben"), ["m1"]));
    while (racing && extra < 400) {
      const i = ROWS + extra++;
      raced.push(store.add(scope("dan"), [memory(i, "dan")], new Set()));
      await new Promise((r) => setTimeout(r, 5));
    }
    await Promise.all(raced);
    await maintenance;
    const active = await activeTable(db);
    assert.match(active, /^memories_l[0-9a-z]+$/, "the pointer names the rewritten table");
    assert.deepEqual(
      await fileFormats(dir, active),
      new Set([FILE_FORMAT]),
      "the rewrite's copy is in the store's file format",
    );
    const stats = await store.stats();
    assert.equal(stats.rows, ROWS + extra - 1, "every row, the racing adds included, and the one forgotten gone");
    assert.equal(stats.indexed, true, "the rewritten table has its vector index");
    const [updated] = await store.get(scope("ana"), ["m0"]);
    assert.match(updated.text, /updated while the table was rewritten/);
    assert.deepEqual(await store.get(scope("ben"), ["m1"]), []);
    const raceIds = Array.from({ length: extra }, (_, j) => `m${ROWS + j}`);
    assert.equal((await store.get(scope("dan"), raceIds)).length, extra);
    // Rows of one owner now sit together: the copy is ordered by tenant, owner, then age.
    const fresh = await db.openTable(active);
    const owned = (await fresh.query().select(["owner"]).limit(ROWS).toArray()).map((r) =>
      String((r as { owner: string }).owner),
    );
    const runs = owned.filter((o, i) => i === 0 || o !== owned[i - 1]).length;
    assert.ok(runs <= owners.length + 2, `one run of rows per owner in the rewritten part (saw ${runs})`);
    fresh.close();
    db.close();
  });

  test("a search's candidates carry their whole memories as stored, from the scope searched only; the next search sees an update or a forget", async () => {
    const where = scope("cat");
    // The memory's columns as plain values (LanceDB hands out Arrow row objects).
    const plain = (m: StoredMemory) => Object.fromEntries(MEMORY_COLUMNS.map((c) => [c, m[c]]));
    const byIdNow = async (ids: string[]) => new Map((await store.get(where, ids)).map((r) => [r.id, plain(r)]));
    // One query for both searches: the memory updated is the first one's best, so the second must find it too.
    const query = around(5, 0.1);
    const found = await store.vectorCandidates(where, query, 8);
    assert.equal(found.length, 8);
    assert.deepEqual(
      new Map(found.map((c) => [c.id, plain(c.memory)])),
      await byIdNow(found.map((c) => c.id)),
      "each vector candidate's memory is its stored row",
    );
    const byText = await store.textCandidates(where, "memory", 8);
    assert.equal(byText.length, 8);
    assert.deepEqual(
      new Map(byText.map((c) => [c.id, plain(c.memory)])),
      await byIdNow(byText.map((c) => c.id)),
      "each text candidate's memory is its stored row",
    );
    for (const c of [...found, ...byText]) assert.equal(Number(c.memory.created), c.createdMs);

    const [updated, forgotten] = found;
    await store.add(
      where,
      [
        {
          ...memory(90_000, "cat"),
          id: updated.id,
          vector: updated.vector,
          text: "cat's memory, updated after the search",
        },
      ],
      new Set([updated.id]),
    );
    assert.equal(await store.forget(where, [forgotten.id]), 1);
    const again = new Map((await store.vectorCandidates(where, query, 8)).map((c) => [c.id, c.memory]));
    assert.equal(again.get(updated.id)?.text, "cat's memory, updated after the search");
    assert.equal(again.has(forgotten.id), false, "a forgotten memory is not a candidate");

    // Each searching for words of the other's memories: a leak of the scope would rank those first.
    for (const [who, other] of [
      ["dan", "cat"],
      ["cat", "dan"],
    ]) {
      const cands = [
        ...(await store.vectorCandidates(scope(who), around(5, 0.1), 20)),
        ...(await store.textCandidates(scope(who), `${other} memory`, 20)),
      ];
      assert.ok(cands.length > 0);
      for (const c of cands)
        assert.equal(c.memory.owner, who, `${who}'s search returned ${c.memory.owner}'s memory ${c.id}`);
    }
  });

  test("a scoped search through the vector index finds what exact search finds; a small scope is searched exactly", async () => {
    let hits = 0;
    let total = 0;
    for (let q = 0; q < 20; q++) {
      const where = scope(owners[q % owners.length]);
      const vector = around(q % centres.length, 0.1);
      const served = new Set((await store.vectorCandidates(where, vector, 40)).slice(0, 10).map((c) => c.id));
      const exact = await store.vectorCandidates(where, vector, 10, "exact");
      for (const c of exact) if (served.has(c.id)) hits++;
      total += exact.length;
    }
    assert.ok(hits / total >= 0.9, `recall@10 of the indexed path ${hits / total}`);
    // The store checked the new index's first searches against exact search itself, and kept it.
    for (let q = 0; q < 32; q++)
      await store.vectorCandidates(scope(owners[q % owners.length]), around(q % centres.length, 0.1), 40);
    const serving = await store.indexServing();
    assert.ok(serving, "an index is in use");
    assert.equal(serving.searches, 32, "the first 32 searches through the index were checked, and no more");
    assert.ok(
      serving.recall !== undefined && serving.recall >= 0.95,
      `the store's own recall@10 figure ${serving.recall}`,
    );
    assert.equal(serving.after, "a new index");
    // It serves at the fewest probes it tried that kept the recall, and tried them all on each search.
    assert.deepEqual(
      serving.tried.map((t) => t.probeScale),
      [1, 2, 4, 8],
    );
    assert.equal(serving.probeScale, serving.tried.find((t) => (t.recall ?? 0) >= 0.95)?.probeScale);
    assert.ok(serving.exactUpTo >= TUNING.exactScopeRows);
    // The low refine factor serves scopes as large as the largest the watch checked, no larger:
    // the tenant's scope here, never checked, keeps the high one.
    const db = await lancedb.connect(dir);
    const table = await db.openTable(await activeTable(db));
    const largest = Math.max(...(await Promise.all(owners.map((o) => table.countRows(scope(o))))));
    table.close();
    db.close();
    assert.equal(serving.checkedUpTo, largest, "the largest scope among the searches checked");
    assert.ok(serving.checkedUpTo < (await store.stats()).rows);
    // A compaction rewrites fragments under the index (which can spoil it): the index is watched again.
    for (let part = 0; part < 2; part++)
      await store.add(
        scope("ana"),
        Array.from({ length: 50 }, (_, j) => memory(80_000 + part * 50 + j, "ana")),
        new Set(),
      );
    await store.maintain();
    const rewatched = await store.indexServing();
    assert.deepEqual([rewatched?.searches, rewatched?.after], [0, "a compaction"]);
    assert.deepEqual(
      [rewatched?.probeScale, rewatched?.exactUpTo],
      [serving.probeScale, serving.exactUpTo],
      "the last plan serves until the new watch decides",
    );
    await store.vectorCandidates(scope("ben"), around(1, 0.1), 40);
    assert.equal((await store.indexServing())?.searches, 1, "the next search through the index is checked");
    // A scope under exactScopeRows: the exact path, so the same list as exact search, in order.
    const only = around(3, 0.1);
    const small = newMemoryRow({
      id: "solo-1",
      tenant: "t",
      owner: "eve",
      agent_id: "main",
      text: "eve's only memory",
      vector: only,
      embedder: EMBEDDER,
    });
    await store.add(scope("eve"), [small], new Set());
    const got = await store.vectorCandidates(scope("eve"), only, 5);
    assert.deepEqual(
      got.map((c) => c.id),
      ["solo-1"],
    );
    assert.ok(Math.abs((got[0].vectorScore ?? 0) - 1) < 1e-4, "the exact path's cosine of a vector with itself");
  });

  test("a store opened again finds the rewritten table, and drops a copy left by a rewrite that never finished", async () => {
    const db = await lancedb.connect(dir);
    const active = await activeTable(db);
    // What a process that died in the middle of a copy leaves: a table named in the meta table as
    // pending, never switched to.
    const meta = await db.openTable("troupe_meta");
    await meta
      .mergeInsert("key")
      .whenMatchedUpdateAll()
      .whenNotMatchedInsertAll()
      .execute([{ key: "layout_table", value: "memories_lhalfdone" }]);
    meta.close();
    await db.createEmptyTable("memories_lhalfdone", schemaFor(DIM));
    const again = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger, TUNING);
    assert.equal((await again.stats()).rows, (await store.stats()).rows);
    assert.ok(!(await db.tableNames()).includes("memories_lhalfdone"), "the unfinished copy is dropped");
    assert.ok((await db.tableNames()).includes(active));
    // An index an earlier process built is watched from the start (the plan is not stored), and
    // again once a compaction runs under it.
    const unknown = [1, 2, 4, 8].map((probeScale) => ({ probeScale, recall: undefined }));
    assert.deepEqual(await again.indexServing(), {
      after: "the store opened",
      searches: 0,
      recall: undefined,
      tried: unknown,
      probeScale: 1,
      exactUpTo: TUNING.exactScopeRows,
      checkedUpTo: 0,
    });
    for (let part = 0; part < 2; part++)
      await again.add(
        scope("eve"),
        Array.from({ length: 50 }, (_, j) => memory(85_000 + part * 50 + j, "eve")),
        new Set(),
      );
    await again.maintain();
    assert.deepEqual(await again.indexServing(), {
      after: "a compaction",
      searches: 0,
      recall: undefined,
      tried: unknown,
      probeScale: 1,
      exactUpTo: TUNING.exactScopeRows,
      checkedUpTo: 0,
    });
    again.close();
    db.close();
  });
});

test("a vector index whose first searches find too little of what exact search finds at any probe count tried is reported, and goes on serving at the most", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-store-"));
  const warnings: string[] = [];
  const watched: Logger = { ...logger, warn: (m) => warnings.push(m) };
  // A recall no index can reach: the index is judged short of it.
  const store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, watched, {
    indexThreshold: 2000,
    exactScopeRows: 500,
    minIndexRecall: 1.01,
  });
  t.after(async () => {
    store.close();
    await rm(dir, { recursive: true, force: true });
  });
  const rows = Array.from({ length: 2400 }, (_, i) => memory(i, i % 2 === 0 ? "fay" : "gus"));
  await store.add("tenant = 't'", rows, new Set());
  await store.maintain();
  for (let q = 0; q < 31; q++)
    await store.vectorCandidates(scope(q % 2 === 0 ? "fay" : "gus"), around(q % centres.length, 0.1), 40);
  assert.equal((await store.indexServing())?.searches, 31);
  assert.deepEqual(warnings, [], "no verdict before the 32nd search");
  const vector = around(2, 0.1);
  const served = await store.vectorCandidates(scope("fay"), vector, 10);
  const serving = await store.indexServing();
  assert.ok(
    serving && serving.searches === 32 && serving.recall !== undefined && serving.recall > 0.8,
    JSON.stringify(serving),
  );
  assert.equal(serving.probeScale, 8, "no scale reached the recall: the most probes tried");
  assert.equal(warnings.length, 1);
  assert.match(
    warnings[0],
    /^the vector index served recall@10 [01]\.\d{3} at 1x, [01]\.\d{3} at 2x, [01]\.\d{3} at 4x, [01]\.\d{3} at 8x the probe rule's count against exact search on its first 32 searches since a new index; probing 8x from now .*; no probe count tried reached 1\.01/,
  );
  // It still serves: the search went through it and found the nearest memories.
  const exact = await store.vectorCandidates(scope("fay"), vector, 10, "exact");
  assert.equal(served.length, 10);
  assert.ok(served.filter((c) => exact.some((e) => e.id === c.id)).length >= 8);
  // Searches past the first 32 are not checked.
  await store.vectorCandidates(scope("gus"), vector, 40);
  assert.equal((await store.indexServing())?.searches, 32);
});

test("the vector index keeps the partitions it was built with through later maintenance, so the probe counts computed for it hold", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-store-"));
  const store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger, { indexThreshold: 20_000 });
  const db = await lancedb.connect(dir);
  t.after(async () => {
    store.close();
    db.close();
    await rm(dir, { recursive: true, force: true });
  });
  // The index's partitions, from what a search through all of them ranks: each of the index's
  // parts (a delta made by optimize() for rows added since the build) ranks its own.
  const partitions = async () => {
    const table = await db.openTable(await activeTable(db));
    const plan = await table
      .vectorSearch(around(1, 0.1))
      .distanceType("cosine")
      .nprobes(100_000)
      .limit(10)
      .analyzePlan();
    table.close();
    const metric = (name: string) => Number(new RegExp(`${name}=(\\d+)`).exec(plan)?.[1]);
    return metric("partitions_ranked") / metric("deltas_searched");
  };
  const ROWS = 32_768;
  for (let start = 0; start < ROWS; start += 4096) {
    await store.add(
      "tenant = 't'",
      Array.from({ length: 4096 }, (_, j) => memory(start + j, owners[(start + j) % owners.length])),
      new Set(),
    );
  }
  await store.maintain();
  assert.equal((await store.stats()).indexed, true);
  const built = await partitions();
  assert.equal(built, partitionsFor(ROWS), "the build made the partitions the store probes by");
  // More writes, then the maintenance a running service does: LanceDB's optimize() joins
  // partitions it finds too small and splits those too large.
  await store.add(
    "tenant = 't'",
    Array.from({ length: 100 }, (_, j) => memory(ROWS + j, "ana")),
    new Set(),
  );
  await store.maintain();
  assert.equal(await partitions(), built, "the index has as many partitions as it was built with");
});

test("a table made before payloads is searched by its columns, takes writes, and gets payloads at its next rewrite", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-legacy-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  // The table as the store made it before payloads: same columns, no payload.
  const db = await lancedb.connect(dir);
  const old = await db.createEmptyTable(TABLE, schemaFor(DIM, false));
  await old.add(
    memoryArrow(
      schemaFor(DIM, false),
      Array.from({ length: 3000 }, (_, i) => memory(i, owners[i % owners.length])),
    ),
  );
  old.close();
  const store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger, { indexThreshold: 2500, exactScopeRows: 500 });
  try {
    const where = scope("ana");
    const query = around(3, 0.1);
    const before = await store.vectorCandidates(where, query, 10, "exact");
    assert.equal(before.length, 10);
    assert.ok(
      before.every((c) => c.memory.owner === "ana" && typeof c.memory.text === "string"),
      "whole memories from the columns",
    );
    await store.add(where, [{ ...memory(5000, "ana"), text: "written to the old table" }], new Set());
    assert.equal((await store.get(where, ["m5000"]))[0].text, "written to the old table");

    await store.maintain();
    const active = await activeTable(db);
    assert.notEqual(active, TABLE, "the table was rewritten although it had not grown by a quarter");
    const fresh = await db.openTable(active);
    assert.ok(
      (await fresh.schema()).fields.some((f) => f.name === "payload"),
      "the rewritten table has payloads",
    );
    const payloads = (await fresh
      .query()
      .where("id IN ('m5000', 'm4')")
      .select(["id", "text", "payload"])
      .toArray()) as { id: string; text: string; payload: string }[];
    assert.equal(payloads.length, 2);
    for (const r of payloads) assert.equal((JSON.parse(r.payload) as StoredMemory).text, r.text);
    fresh.close();
    // m5000's random vector may rank among the ten; the ten before it must be the same.
    const after = (await store.vectorCandidates(where, query, 11, "exact"))
      .filter((c) => c.id !== "m5000")
      .slice(0, 10);
    assert.deepEqual(
      after.map((c) => c.id),
      before.map((c) => c.id),
      "the same memories, now read from their payloads",
    );
    const plain = (m: StoredMemory) =>
      Object.fromEntries(MEMORY_COLUMNS.map((c) => [c, c === "created" || c === "updated" ? Number(m[c]) : m[c]]));
    assert.deepEqual(
      after.map((c) => plain(c.memory)),
      before.map((c) => plain(c.memory)),
    );
    await store.add(where, [{ ...memory(5001, "ana"), text: "written to the new table" }], new Set());
    assert.equal((await store.get(where, ["m5001"]))[0].text, "written to the new table");
  } finally {
    store.close();
    db.close();
  }
});

test("adds that arrive together share commits; each caller gets its own answer, a refusal fails only its caller", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-group-"));
  const store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger);
  const db = await lancedb.connect(dir);
  try {
    const row = (owner: string, text: string, id?: string) =>
      newMemoryRow({
        ...(id ? { id } : {}),
        tenant: "t",
        owner,
        agent_id: "main",
        text,
        vector: around(1, 0.3),
        embedder: EMBEDDER,
      });
    const [seed] = await store.add(scope("ana"), [row("ana", "ana's seed")], new Set());
    const table = await db.openTable(TABLE);
    const v0 = await table.version();
    const answers = await Promise.allSettled([
      ...Array.from({ length: 30 }, (_, i) =>
        store.add(scope(owners[i % 2]), [row(owners[i % 2], `fact ${i}`)], new Set()),
      ),
      store.add(scope("ana"), [row("ana", "shared fact")], new Set()),
      store.add(scope("ana"), [row("ana", "shared fact")], new Set()),
      store.add(scope("ben"), [row("ben", "shared fact")], new Set()),
      // ben names ana's memory: refused, as a lone add would be.
      store.add(scope("ben"), [row("ben", "taken over", seed.id)], new Set([seed.id])),
      // Two upserts of one new id: the first adds it, the second (planned after the first's
      // commit) updates it.
      store.add(scope("ana"), [row("ana", "first version", "u1")], new Set(["u1"])),
      store.add(scope("ana"), [row("ana", "second version", "u1")], new Set(["u1"])),
    ]);
    const ok = (i: number) => {
      const a = answers[i];
      assert.equal(a.status, "fulfilled", `caller ${i}: ${a.status === "rejected" ? a.reason : ""}`);
      return (a as PromiseFulfilledResult<{ id: string; outcome: string }[]>).value[0];
    };
    for (let i = 0; i < 30; i++) assert.equal(ok(i).outcome, "added");
    assert.equal(ok(30).outcome, "added");
    assert.deepEqual(ok(31), { id: ok(30).id, outcome: "duplicate" }, "the same text in the same scope is stored once");
    assert.equal(ok(32).outcome, "added", "the same text in another scope is its own memory");
    assert.notEqual(ok(32).id, ok(30).id);
    const refused = answers[33];
    assert.equal(refused.status, "rejected");
    assert.match(String((refused as PromiseRejectedResult).reason), /belongs to another scope/);
    assert.deepEqual(
      [ok(34), ok(35)],
      [
        { id: "u1", outcome: "added" },
        { id: "u1", outcome: "updated" },
      ],
    );

    assert.equal(
      (await store.get(scope("ana"), [seed.id]))[0].text,
      "ana's seed",
      "the refused caller changed nothing",
    );
    assert.equal((await store.get(scope("ana"), ["u1"]))[0].text, "second version");
    await table.checkoutLatest();
    assert.equal(await table.countRows(), 1 + 30 + 2 + 1);
    const u1 = await store.history(scope("ana"), "u1");
    assert.deepEqual(
      u1.map((h) => [h.event, h.new_text]),
      [
        [1, "first version"],
        [2, "second version"],
      ],
    );
    // 35 callers' writes: one commit each before group commits. The first add goes alone; the
    // rest queue behind it and go together, split where a caller repeats a text or an id that an
    // earlier caller is writing (the second "shared fact", the second upsert of u1).
    const commits = (await table.version()) - v0;
    assert.ok(commits <= 6, `35 adds took ${commits} commits of the table`);
    table.close();
  } finally {
    store.close();
    db.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("LanceDB's metadata cache stays within the store's cap as commits pile up", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-lance-cache-"));
  const cap = 256 * 1024;
  // The same commits through a capped connection and one at LanceDB's own 1 GB, each in its
  // own directory: every commit adds its version's metadata to the cache.
  const work = async (db: lancedb.Connection, name: string) => {
    const table = await db.createTable(name, [{ id: "seed", vector: [0, 0, 0, 0] }]);
    for (let i = 0; i < 150; i++) await table.add([{ id: `r${i}`, vector: [i, 1, 2, 3] }]);
    await table.countRows();
    table.close();
  };
  const capped = await connectMemoryDb(path.join(dir, "capped"), {}, cap);
  const wide = await connectMemoryDb(path.join(dir, "wide"), {}, 1024 * 1024 * 1024);
  try {
    await work(capped, "t");
    await work(wide, "t");
    assert.ok(cachedBytes(wide) > 2 * cap, `uncapped, the cache held ${cachedBytes(wide)} bytes`);
    assert.ok(cachedBytes(capped) <= cap, `capped at ${cap}, the cache held ${cachedBytes(capped)} bytes`);
  } finally {
    capped.close();
    wide.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("LanceDB's index cache stays within the store's cap as searches read indexes", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-lance-index-cache-"));
  const meta = 256 * 1024;
  const cap = 64 * 1024;
  // The same table and searches through a connection whose index cache is capped and one whose
  // is not; both have the same small metadata cap, so what differs is what the indexes left.
  const work = async (db: lancedb.Connection) => {
    const rows = Array.from({ length: 3000 }, (_, i) => ({
      id: `r${i}`,
      text: `note ${i} about w${i % 97} and w${(i * 7) % 89}`,
      vector: [i % 5, 1, 2, 3],
    }));
    const table = await db.createTable("t", rows);
    await table.createIndex("id", { config: lancedb.Index.btree() });
    await table.createIndex("text", { config: lancedb.Index.fts() });
    for (let i = 0; i < 60; i++) {
      await table
        .query()
        .where(`id = 'r${i * 37}'`)
        .toArray();
      await table
        .search(`w${i % 97}`, "fts")
        .limit(5)
        .toArray();
    }
    table.close();
  };
  const capped = await connectMemoryDb(path.join(dir, "capped"), {}, meta, cap);
  const wide = await connectMemoryDb(path.join(dir, "wide"), {}, meta, 512 * 1024 * 1024);
  try {
    await work(capped);
    await work(wide);
    assert.ok(cachedBytes(wide) > meta + 2 * cap, `uncapped, the caches held ${cachedBytes(wide)} bytes`);
    assert.ok(cachedBytes(capped) <= meta + cap, `capped, the caches held ${cachedBytes(capped)} bytes`);
  } finally {
    capped.close();
    wide.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("openings anew are spaced in time: under a burst of commits, one set of replaced handles waits at a time", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-reconnect-spaced-"));
  // Due every 2 commits, but at most once in 30 s (the default spacing, RETIRE_AFTER_MS).
  const store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger, { reconnectCommits: 2 });
  try {
    for (let i = 0; i < 24; i++) await store.add(scope("ana"), [memory(i, "ana")], new Set());
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await store.stats()).reconnects, 1, "one opening in a burst well under 30 s");
    assert.equal((await store.stats()).rows, 24);
  } finally {
    store.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("a store that opens its database anew every few commits loses nothing, and searches go on through each switch", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-memory-reconnect-"));
  const store = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger, { reconnectCommits: 4, reconnectMinMs: 0 });
  try {
    let searching = true;
    let searches = 0;
    const failures: string[] = [];
    const searcher = (async () => {
      while (searching) {
        try {
          await store.vectorCandidates(scope("ana"), around(3, 0.1), 8);
          searches++;
        } catch (err) {
          failures.push(String(err));
        }
      }
    })();
    const ids: string[] = [];
    for (let i = 0; i < 40; i++) {
      const [added] = await store.add(scope("ana"), [memory(i, "ana")], new Set());
      ids.push(added.id);
      if (i === 20) await store.forget(scope("ana"), [ids[3]]);
    }
    searching = false;
    await searcher;
    assert.deepEqual(failures.slice(0, 3), [], "no search failed across the switches");
    assert.ok(searches > 0);
    const stats = await store.stats();
    // One is due every 4 of the 41 commits; those due while maintenance runs (from the 20th
    // commit on, for as long as it takes) are skipped. The first four fall before it.
    assert.ok(stats.reconnects >= 4, `41 commits, a switch due every 4: ${stats.reconnects} switches`);
    const kept = ids.filter((_, i) => i !== 3);
    assert.deepEqual((await store.get(scope("ana"), ids)).map((m) => m.id).sort(), [...kept].sort());
    assert.equal(stats.rows, 39);
    assert.deepEqual(
      (await store.history(scope("ana"), ids[3])).map((h) => h.event),
      [1, 3],
      "the history, written through every connection, has the add and the forget",
    );
    const found = await store.vectorCandidates(scope("ana"), around(7, 0.1), 5);
    assert.ok(found.length > 0, "the newest connection searches");
  } finally {
    store.close();
  }
  const again = await MemoryStore.open(dir, {}, EMBEDDER, DIM, logger);
  try {
    assert.equal((await again.stats()).rows, 39, "a store opened afterwards finds every row");
  } finally {
    again.close();
    await rm(dir, { recursive: true, force: true });
  }
});
