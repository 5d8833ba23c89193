// bench/memory-writes: facts stored as learning stores them, one caller per fact with many
// callers at once, through the memory store's writer (embedding excluded: vectors are made
// beforehand). Group commit (the store's default) against, in the same run, one commit per add
// (maxAddGroup 1, how the store wrote before group commits). Each mode runs in its own process,
// so its resident memory is its own: figures are facts per second, the table's commits per fact,
// and RSS growth per fact after the first fifth (LanceDB keeps native memory per commit:
// bench/lance-growth).
//
//   node dist/bench/memory-writes.js [--facts 3000] [--callers 20] [--reconnect-commits N]
//
// --reconnect-commits: how often the store opens the database anew (TROUPE_MEMORY_RECONNECT_COMMITS;
// the store's default when not given, 0: never).
//
// RESULT grouped_facts_per_s=... single_facts_per_s=... ratio=... grouped_commits_per_fact=...
//        grouped_kb_per_fact=... single_kb_per_fact=...
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import * as lancedb from "@lancedb/lancedb";
import { newMemoryRow, sqlString } from "../services/memory/memory-schema.js";
import { TABLE } from "../services/memory/meta.js";
import { MemoryStore } from "../services/memory/store.js";
import { createLogger } from "../services/shared/process/log.js";
import { runChild } from "./support/child-run.js";

const { values } = parseArgs({
  options: {
    facts: { type: "string", default: "3000" },
    callers: { type: "string", default: "20" },
    "reconnect-commits": { type: "string" },
    child: { type: "string" },
    dir: { type: "string" },
  },
});
const FACTS = Number(values.facts);
const CALLERS = Number(values.callers);
const DIM = 256;
const OWNERS = 50;

interface Figures {
  factsPerS: number;
  commitsPerFact: number;
  kbPerFact: number;
}

/** One mode's run: CALLERS loops, each storing one fact per call until FACTS are stored. */
async function child(maxAddGroup: number, dir: string): Promise<void> {
  const store = await MemoryStore.open(dir, {}, "bench-synthetic", DIM, createLogger("bench", "error"), {
    maxAddGroup,
    ...(values["reconnect-commits"] === undefined ? {} : { reconnectCommits: Number(values["reconnect-commits"]) }),
  });
  const vectors = Array.from({ length: FACTS }, () => Float32Array.from({ length: DIM }, () => Math.random() - 0.5));
  const rss = () => {
    (globalThis as { gc?: () => void }).gc?.();
    return process.memoryUsage().rss / 1024;
  };
  const warm = Math.round(FACTS / 5);
  let next = 0;
  let rssAtWarm = 0;
  let t0 = 0;
  let v0 = 0;
  const db = await lancedb.connect(dir);
  const version = async () => {
    const t = await db.openTable(TABLE);
    const v = await t.version();
    t.close();
    return v;
  };
  const caller = async () => {
    for (let i = next++; i < FACTS; i = next++) {
      if (i === warm) {
        rssAtWarm = rss();
        v0 = await version();
        t0 = performance.now();
      }
      const owner = `u${i % OWNERS}`;
      const row = newMemoryRow({
        tenant: "t",
        owner,
        agent_id: "main",
        text: `fact ${i}: ${owner} likes colour ${i}`,
        vector: vectors[i],
        embedder: "bench-synthetic",
      });
      await store.add(`tenant = 't' AND owner = ${sqlString(owner)} AND agent_id = 'main'`, [row], new Set(), "bench");
    }
  };
  await Promise.all(Array.from({ length: CALLERS }, caller));
  const seconds = (performance.now() - t0) / 1000;
  const stored = FACTS - warm;
  const figures: Figures = {
    factsPerS: stored / seconds,
    commitsPerFact: ((await version()) - v0) / stored,
    kbPerFact: (rss() - rssAtWarm) / stored,
  };
  store.close();
  db.close();
  process.stdout.write(`${JSON.stringify(figures)}\n`);
}

async function run(maxAddGroup: number): Promise<Figures> {
  const args = ["--child", String(maxAddGroup), "--facts", String(FACTS), "--callers", String(CALLERS)];
  if (values["reconnect-commits"] !== undefined) args.push("--reconnect-commits", values["reconnect-commits"]);
  return runChild<Figures>(fileURLToPath(import.meta.url), `memory-writes-${maxAddGroup}`, args);
}

if (values.child) await child(Number(values.child), values.dir!);
else {
  const single = await run(1);
  const grouped = await run(64);
  const f = (n: number, d = 1) => n.toFixed(d);
  console.log(`facts=${FACTS} callers=${CALLERS} (one fact per add; figures after the first fifth)`);
  for (const [name, r] of [
    ["one commit per add (baseline)", single],
    ["group commit", grouped],
  ] as const)
    console.log(
      `${name}: ${f(r.factsPerS, 0)} facts/s, ${f(r.commitsPerFact, 2)} commits of the table per fact, ${f(r.kbPerFact)} KB of RSS per fact`,
    );
  console.log(
    `RESULT grouped_facts_per_s=${f(grouped.factsPerS, 0)} single_facts_per_s=${f(single.factsPerS, 0)} ratio=${f(grouped.factsPerS / single.factsPerS, 2)} grouped_commits_per_fact=${f(grouped.commitsPerFact, 2)} grouped_kb_per_fact=${f(grouped.kbPerFact)} single_kb_per_fact=${f(single.kbPerFact)}`,
  );
}
