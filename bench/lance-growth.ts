// Where the memory service's resident memory goes under writes: LanceDB's native side, measured
// apart from Troupe. Each child process opens a table of 500 rows and then either commits one row
// at a time (an add, as a learned fact is stored), compacting and cleaning up every 100 as the
// memory service's maintenance does, or only searches (the baseline: reads). Both sample RSS and
// the V8 heap. In the run of bench/history.md, commits grew RSS by tens of KB each with the heap
// flat, and searches did not: the growth is native and per commit, which is what the hour soak's
// memory service showed (upstream: lance-format/lance#1983, lancedb/lancedb#2693).
//
// With --batch N, each commit adds N rows (a group commit of N callers' facts), which tells
// growth per commit from growth per row. --scalar-index keeps the table as the memory service
// does (a btree on id that each add's dedupe lookup uses, maintenance every 20 commits);
// --metadata-cache-mb and --index-cache-mb cap LanceDB's two session caches. --reconnect-every N
// closes the table and its connection every N commits and opens them anew (a new session too),
// as the memory service does every TROUPE_MEMORY_RECONNECT_COMMITS commits.
//
//   node --expose-gc dist/bench/lance-growth.js [--ops 3000] [--batch 1] [--scalar-index]
//     [--metadata-cache-mb M] [--index-cache-mb I] [--reconnect-every N]
//
// RESULT add_kb_per_op=... search_kb_per_op=... add_heap_mb=... ratio=... batch=... reconnect_every=...
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { runChild } from "./support/child-run.js";

const { values } = parseArgs({
  options: {
    ops: { type: "string", default: "3000" },
    batch: { type: "string", default: "1" },
    "metadata-cache-mb": { type: "string" },
    "index-cache-mb": { type: "string" },
    "scalar-index": { type: "boolean", default: false },
    "reconnect-every": { type: "string", default: "0" },
    child: { type: "string" },
    dir: { type: "string" },
  },
});
const OPS = Number(values.ops);
const BATCH = Number(values.batch);
const METADATA_CACHE_MB = values["metadata-cache-mb"];
const INDEX_CACHE_MB = values["index-cache-mb"];
const SCALAR_INDEX = values["scalar-index"];
const RECONNECT_EVERY = Number(values["reconnect-every"]);
const mb = (v: string | undefined) => (v === undefined ? undefined : BigInt(Number(v) * 1048576));
const DIM = 256;

/** One child's work: `mode` OPS times; prints RSS and heap (MB) after the first fifth and at the end. */
async function child(mode: "add" | "search", dir: string): Promise<void> {
  const lancedb = await import("@lancedb/lancedb");
  const newSession = () =>
    METADATA_CACHE_MB || INDEX_CACHE_MB
      ? new lancedb.Session(mb(INDEX_CACHE_MB), mb(METADATA_CACHE_MB))
      : lancedb.Session.default();
  let session = newSession();
  let db = await lancedb.connect(dir, { session });
  const vec = () => Array.from({ length: DIM }, () => Math.random());
  let table = await db.createTable(
    "m",
    Array.from({ length: 500 }, (_, i) => ({ id: `s${i}`, text: `seed ${i}`, vector: vec() })),
  );
  // As the memory service keeps its table: a btree on id that each add's dedupe lookup uses, and
  // maintenance (compaction, index catch-up) every 20 writes.
  if (SCALAR_INDEX) await table.createIndex("id", { config: lancedb.Index.btree() });
  const maintainEvery = SCALAR_INDEX ? 20 : 100;
  const warm = Math.round(OPS / 5);
  const sample = () => {
    (globalThis as { gc?: () => void }).gc?.();
    const m = process.memoryUsage();
    return { rss: m.rss / 1048576, heap: m.heapUsed / 1048576, cache: Number(session.sizeBytes()) / 1048576 };
  };
  let first = sample();
  for (let i = 1; i <= OPS; i++) {
    if (mode === "add") {
      if (SCALAR_INDEX)
        await table
          .query()
          .where(`id = 'x${i - 1}.0'`)
          .limit(1)
          .toArray();
      await table.add(
        Array.from({ length: BATCH }, (_, k) => ({ id: `x${i}.${k}`, text: `fact ${i}.${k}`, vector: vec() })),
      );
      if (i % maintainEvery === 0) await table.optimize({ cleanupOlderThan: new Date() });
      if (RECONNECT_EVERY > 0 && i % RECONNECT_EVERY === 0) {
        table.close();
        db.close();
        session = newSession();
        db = await lancedb.connect(dir, { session });
        table = await db.openTable("m");
      }
    } else await table.vectorSearch(vec()).limit(5).toArray();
    if (i === warm) first = sample();
  }
  const last = sample();
  process.stdout.write(`${JSON.stringify({ first, last, ops: OPS - warm })}\n`);
}

async function run(mode: "add" | "search"): Promise<{ kbPerOp: number; heapMb: number }> {
  const args = ["--child", mode, "--ops", String(OPS), "--batch", String(BATCH)];
  if (METADATA_CACHE_MB) args.push("--metadata-cache-mb", METADATA_CACHE_MB);
  if (INDEX_CACHE_MB) args.push("--index-cache-mb", INDEX_CACHE_MB);
  if (SCALAR_INDEX) args.push("--scalar-index");
  if (RECONNECT_EVERY > 0) args.push("--reconnect-every", String(RECONNECT_EVERY));
  const { first, last, ops } = await runChild<{
    first: { rss: number; heap: number; cache: number };
    last: { rss: number; heap: number; cache: number };
    ops: number;
  }>(fileURLToPath(import.meta.url), `lance-${mode}`, args);
  console.log(`  ${mode}: LanceDB session caches ${first.cache.toFixed(1)} -> ${last.cache.toFixed(1)} MB`);
  return { kbPerOp: ((last.rss - first.rss) * 1024) / ops, heapMb: last.heap - first.heap };
}

if (values.child) await child(values.child as "add" | "search", values.dir!);
else {
  const search = await run("search");
  const add = await run("add");
  const f = (n: number) => n.toFixed(1);
  console.log(
    `commits (${BATCH} row(s) each, compacted every ${SCALAR_INDEX ? "20, a btree on id" : "100"}${RECONNECT_EVERY > 0 ? `, reconnected every ${RECONNECT_EVERY}` : ""}): ${f(add.kbPerOp)} KB of RSS per commit, heap ${f(add.heapMb)} MB`,
  );
  console.log(`baseline, searches only: ${f(search.kbPerOp)} KB of RSS per search`);
  console.log(
    `RESULT add_kb_per_op=${f(add.kbPerOp)} search_kb_per_op=${f(search.kbPerOp)} add_heap_mb=${f(add.heapMb)} ratio=${f(add.kbPerOp / Math.max(search.kbPerOp, 0.1))} batch=${BATCH} reconnect_every=${RECONNECT_EVERY}`,
  );
}
