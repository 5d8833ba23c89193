// The quality check of memory search on a small labelled set the project ships
// (test/fixtures/memory-quality.json: near-duplicates, stale facts replaced by newer ones), scored
// for vector-only, hybrid, and hybrid + MMR through the service's own search pipeline on a real
// LanceDB table: recall@3 (of the groups that answer each query), how many of the top 3 repeat a
// group already shown (what MMR changes), and how often a stale fact outranks its replacement.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { LocalEmbedder } from "../services/memory/embedder.js";
import { SearchOptionsSchema } from "../services/shared/gen/troupe/v1/memory_pb.js";
import { rankOptions, search } from "../services/memory/server.js";
import { MemoryStore } from "../services/memory/store.js";
import { newMemoryRow } from "../services/memory/memory-schema.js";
import { createLogger } from "../services/shared/process/log.js";

interface Fixture {
  memories: { id: string; group: string; ageDays: number; evergreen?: boolean; text: string }[];
  queries: { query: string; relevant: string[]; stale?: string[] }[];
}

const K = 3;
const FIXTURE = fileURLToPath(new URL("../../test/fixtures/memory-quality.json", import.meta.url));
let dir: string;
let store: MemoryStore;
let data: Fixture;
const embedder = new LocalEmbedder();
const NOW = Date.now();

before(async () => {
  data = JSON.parse(await readFile(FIXTURE, "utf8")) as Fixture;
  dir = await mkdtemp(path.join(os.tmpdir(), "troupe-quality-"));
  store = await MemoryStore.open(dir, {}, embedder.name, embedder.dim, createLogger("test", "error"));
  const vectors = await embedder.embed(data.memories.map((m) => m.text));
  await store.add(
    "tenant = 'q' AND owner = 'q'",
    data.memories.map((m, i) =>
      newMemoryRow({
        id: m.id,
        tenant: "q",
        owner: "q",
        agent_id: "main",
        text: m.text,
        vector: vectors[i],
        created: NOW - m.ageDays * 86_400_000,
        updated: NOW,
        evergreen: m.evergreen ?? false,
        provenance: "fixture",
        embedder: embedder.name,
      }),
    ),
    new Set(),
  );
  await store.maintain();
});
after(async () => {
  store?.close();
  await rm(dir, { recursive: true, force: true });
});

interface Score {
  recall: number;
  repeats: number;
  staleFirst: number;
}

async function score(init: MessageInitShape<typeof SearchOptionsSchema>): Promise<Score> {
  const options = create(SearchOptionsSchema, init);
  const groupOf = new Map(data.memories.map((m) => [m.id, m.group]));
  let recall = 0;
  let repeats = 0;
  let staleFirst = 0;
  for (const q of data.queries) {
    const [vector] = await embedder.embed([q.query]);
    const { ranked } = await search(store, "tenant = 'q' AND owner = 'q'", q.query, vector, rankOptions(options, K));
    const groups = ranked.map((r) => groupOf.get(r.id)!);
    recall += q.relevant.filter((g) => groups.includes(g)).length / q.relevant.length;
    repeats += groups.length - new Set(groups).size;
    for (const stale of q.stale ?? []) {
      const s = groups.indexOf(stale);
      const fresh = Math.min(...q.relevant.map((g) => groups.indexOf(g)).filter((i) => i >= 0));
      if (s >= 0 && (!Number.isFinite(fresh) || s < fresh)) staleFirst++;
    }
  }
  return { recall: recall / data.queries.length, repeats, staleFirst };
}

test(`labelled set: recall@${K}, repeated groups and stale-first for vector-only, hybrid, hybrid + MMR`, async () => {
  const vectorOnly = await score({ hybrid: false, mmrLambda: 1 });
  const hybrid = await score({ mmrLambda: 1 });
  const mmrDefault = await score({});
  const mmrHalf = await score({ mmrLambda: 0.5 });
  const mmrStrong = await score({ mmrLambda: 0.4 });
  const noDecay = await score({ mmrLambda: 0.5, halfLifeDays: 0 });
  const line = (name: string, s: Score) =>
    `${name.padEnd(34)} recall@${K} ${s.recall.toFixed(3)}  repeated groups in top ${K}: ${String(s.repeats).padStart(2)}  stale fact first: ${s.staleFirst}`;
  console.log(
    [
      `memory quality (${data.memories.length} memories, ${data.queries.length} queries, local embedder, decay 30 days unless said):`,
      line("vector only", vectorOnly),
      line("hybrid (0.7/0.3)", hybrid),
      line("hybrid + MMR lambda 0.7 (default)", mmrDefault),
      line("hybrid + MMR lambda 0.5", mmrHalf),
      line("hybrid + MMR lambda 0.4", mmrStrong),
      line("hybrid + MMR lambda 0.5, no decay", noDecay),
    ].join("\n"),
  );
  assert.ok(hybrid.recall >= vectorOnly.recall, "words help: hybrid finds at least what vectors alone find");
  assert.ok(mmrDefault.repeats <= hybrid.repeats && mmrDefault.recall >= hybrid.recall, "MMR never makes it worse");
  assert.ok(mmrHalf.repeats < hybrid.repeats, "MMR shows fewer near-duplicates");
  assert.ok(mmrHalf.recall > hybrid.recall, "and the room they leave goes to other relevant memories");
  assert.equal(mmrHalf.staleFirst, 0, "with decay, a replaced fact never outranks the newer one");
  assert.ok(noDecay.staleFirst > 0, "without decay it does: the set tells the two apart");
});
