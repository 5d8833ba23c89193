// bench/memory-reopen: what the memory store's opening anew of its database (every
// TROUPE_MEMORY_RECONNECT_COMMITS commits; docs/memory.md, "Writes") costs the searches right after
// it, when the new connection's caches are cold. A table of --rows memories (the vector index
// built), then --commits single adds, each followed by one hybrid search scoped to an owner (as the
// runner's are) and one tenant-wide. The store opens the database anew every --every commits. The
// first search of each kind after an opening is compared with the others of the same run (the
// baseline: the same searches on warm caches).
//
//   node dist/bench/memory-reopen.js [--rows 20000] [--commits 400] [--every 20]
//
// RESULT scoped_after_p50_ms=... scoped_between_p50_ms=... wide_after_p50_ms=... wide_between_p50_ms=... openings=...
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { createLogger } from "../services/shared/process/log.js";
import { rankOptions, search } from "../services/memory/server.js";
import { MemoryStore } from "../services/memory/store.js";
import { newMemoryRow, sqlString } from "../services/memory/memory-schema.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    rows: { type: "string", default: "20000" },
    commits: { type: "string", default: "400" },
    every: { type: "string", default: "20" },
  },
});
const ROWS = Number(values.rows);
const COMMITS = Number(values.commits);
const EVERY = Number(values.every);
const DIM = 256;
const OWNERS = 100;
const TOPICS = 256;

let seed = 7;
const rand = () => (seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32;
const centres = Array.from({ length: TOPICS }, () => Float32Array.from({ length: DIM }, () => rand() - 0.5));
const around = (t: number) => Float32Array.from(centres[t], (c) => c + 0.05 * (rand() - 0.5));
const row = (i: number) =>
  newMemoryRow({
    id: `m${i}`,
    tenant: "bench",
    owner: `o${i % OWNERS}`,
    agent_id: "main",
    text: `memory ${i} about topic ${i % TOPICS} and w${Math.floor(rand() * 5000)}`,
    vector: around(i % TOPICS),
    provenance: "bench",
    embedder: "bench-synthetic",
  });

const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-bench-reopen-"));
const store = await MemoryStore.open(dir, {}, "bench-synthetic", DIM, createLogger("bench", "error"), {
  reconnectCommits: EVERY,
  reconnectMinMs: 0,
});
try {
  for (let start = 0; start < ROWS; start += 1000)
    await store.add(
      "tenant = 'bench'",
      Array.from({ length: Math.min(1000, ROWS - start) }, (_, j) => row(start + j)),
      new Set(),
    );
  await store.maintain();
  await store.indexServing();
  const timed = async (where: string) => {
    const t = Math.floor(rand() * TOPICS);
    const t0 = performance.now();
    await search(store, where, `topic ${t}`, around(t), rankOptions(undefined, 10));
    return performance.now() - t0;
  };
  const after = { scoped: [] as number[], wide: [] as number[] };
  const between = { scoped: [] as number[], wide: [] as number[] };
  let seen = store.reconnects;
  // A first pass warms the caches of the connection the store starts on.
  for (let i = 0; i < 20; i++) {
    await timed(`tenant = 'bench' AND owner = ${sqlString(`o${i % OWNERS}`)}`);
    await timed("tenant = 'bench'");
  }
  for (let i = 0; i < COMMITS; i++) {
    await store.add(`tenant = 'bench' AND owner = 'o${i % OWNERS}'`, [row(ROWS + i)], new Set());
    // The opening runs in the writer's queue after the commit that made it due: wait for it, so
    // that the next searches are the first on the new connection.
    if ((i + 1) % EVERY === 0)
      for (let w = 0; w < 200 && store.reconnects === seen; w++) await new Promise((r) => setTimeout(r, 5));
    const fresh = store.reconnects !== seen;
    seen = store.reconnects;
    const into = fresh ? after : between;
    into.scoped.push(await timed(`tenant = 'bench' AND owner = ${sqlString(`o${(i * 7) % OWNERS}`)}`));
    into.wide.push(await timed("tenant = 'bench'"));
  }
  const f = (xs: number[], p: number) => pct(xs, p).toFixed(2);
  console.log(
    `${ROWS} rows, ${COMMITS} single commits, the database opened anew every ${EVERY}: ${store.reconnects} openings`,
  );
  for (const [name, a, b] of [
    ["scoped to an owner", after.scoped, between.scoped],
    ["tenant-wide", after.wide, between.wide],
  ] as const)
    console.log(
      `${name}: first search after an opening p50 ${f(a, 50)} ms p95 ${f(a, 95)} ms (${a.length}); the others (baseline) p50 ${f(b, 50)} ms p95 ${f(b, 95)} ms (${b.length})`,
    );
  console.log(
    `RESULT scoped_after_p50_ms=${f(after.scoped, 50)} scoped_between_p50_ms=${f(between.scoped, 50)} wide_after_p50_ms=${f(after.wide, 50)} wide_between_p50_ms=${f(between.wide, 50)} openings=${store.reconnects}`,
  );
} finally {
  store.close();
  await rm(dir, { recursive: true, force: true });
}
