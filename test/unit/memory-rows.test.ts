// The memory table's pure parts: rows to Arrow columns and payloads, the vector index's shape
// (partitions, PQ sub-vectors), and the plan a watch of the index decides from its figures.
import { test } from "node:test";
import assert from "node:assert/strict";
import { arrowTable } from "../../services/memory/columns.js";
import { MEMORY_COLUMNS, memoryArrow, newMemoryRow, schemaFor } from "../../services/memory/memory-schema.js";
import { partitionsFor, planFrom, subVectorsFor } from "../../services/memory/search-plan.js";

test("a watch's figures decide the plan: the fewest probes that keep the recall, and exact search where it costs less than the index", () => {
  // 100 of exact search's top-ten memories; found at 1x, 2x, 4x and 8x the probe rule's count.
  const figures = {
    hits: [88, 93, 99, 100],
    total: 100,
    indexedMs: [
      [10, 12, 11],
      [15, 14, 16],
      [21, 20, 22],
      [30, 31, 29],
    ],
    exactMsPerRow: [0.001, 0.002, 0.0015],
  };
  const tuning = { minIndexRecall: 0.95, exactScopeRows: 2000 };
  // 4x is the first to reach 0.95; its median search takes 21 ms, and exact search 1.5 ms per
  // 1,000 rows: scopes of up to 14,000 rows are cheaper to search exactly.
  assert.deepEqual(planFrom(figures, tuning), {
    plan: { probeScale: 4, exactUpTo: 14_000 },
    met: true,
    recalls: [0.88, 0.93, 0.99, 1],
    indexedMs: 21,
    exactMsPerRow: 0.0015,
  });
  assert.deepEqual(planFrom(figures, { ...tuning, minIndexRecall: 0.9 }).plan, { probeScale: 2, exactUpTo: 10_000 });
  // No scale reaches it: the most probes, and the caller warns.
  const short = planFrom(figures, { ...tuning, minIndexRecall: 1.01 });
  assert.deepEqual([short.plan.probeScale, short.met], [8, false]);
  // Rows spread in write order make exact search dear: only the configured small scopes go exact.
  assert.equal(planFrom({ ...figures, exactMsPerRow: [0.012, 0.013, 0.011] }, tuning).plan.exactUpTo, 2000);
  // Exact search measured nearly free still stops at the largest scope a watch checks.
  assert.equal(planFrom({ ...figures, exactMsPerRow: [0, 0, 0] }, tuning).plan.exactUpTo, 100_000);
});

test("the vector index's partitions: about 8,192 rows each, at least one", () => {
  assert.deepEqual([1_000_000, 100_000, 32_768, 5_000, 0].map(partitionsFor), [122, 12, 4, 1, 1]);
});

test("the vector index's PQ sub-vectors: about one per 4 dimensions, always a divisor of the dimension", () => {
  assert.deepEqual([256, 1536, 384, 32].map(subVectorsFor), [64, 384, 96, 8]);
  // Dimensions a quarter of which does not divide: the next smaller divisor.
  assert.deepEqual([30, 7, 3, 1].map(subVectorsFor), [6, 1, 1, 1]);
});

test("rows become Arrow columns of the schema's types; a row missing a column or with a vector of the wrong size is refused", () => {
  const schema = schemaFor(4, false);
  const rows = [
    newMemoryRow({
      tenant: "t",
      owner: "o",
      agent_id: "a",
      text: "héllo, 漢字 ✓",
      vector: [1, 0, 0, 0],
      embedder: "e",
      evergreen: true,
    }),
    newMemoryRow({
      tenant: "t",
      owner: "o",
      agent_id: "a",
      text: "",
      vector: new Float32Array([0, 1, 0, 0]),
      embedder: "e",
      importance: 0.25,
    }),
  ];
  const table = arrowTable(schema, rows);
  assert.equal(table.numRows, 2);
  const [first, second] = table.toArray().map((r) => r.toJSON());
  assert.equal(first.text, "héllo, 漢字 ✓");
  assert.equal(second.text, "");
  assert.equal(first.evergreen, true);
  assert.equal(second.evergreen, false);
  assert.equal(second.importance, 0.25);
  assert.equal(Number(first.created), rows[0].created);
  assert.deepEqual([...(second.vector as Iterable<number>)], [0, 1, 0, 0]);
  const { text: _, ...noText } = rows[0];
  assert.throws(() => arrowTable(schema, [noText]), /column text is missing/);
  assert.throws(() => arrowTable(schema, [{ ...rows[0], vector: [1, 2, 3] }]), /3 values in a row, not 4/);
});

test("a memory row's payload is its columns as JSON, made at the write from the row itself", () => {
  const rows = [
    newMemoryRow({
      tenant: "t",
      owner: "o",
      agent_id: "a",
      text: 'héllo, "quoted" 漢字',
      vector: [1, 0, 0, 0],
      embedder: "e",
      evergreen: true,
      metadata: '{"k":"v"}',
    }),
    newMemoryRow({
      tenant: "t",
      owner: "o",
      agent_id: "a",
      text: "second",
      vector: [0, 1, 0, 0],
      embedder: "e",
      importance: 0.25,
      created: 1_700_000_000_000,
    }),
  ];
  // A payload a caller passes is not trusted: the row's own columns decide.
  const table = memoryArrow(
    schemaFor(4),
    rows.map((r) => ({ ...r, payload: "{}" })),
  );
  for (const [i, r] of table
    .toArray()
    .map((x) => x.toJSON())
    .entries()) {
    const want = Object.fromEntries(
      MEMORY_COLUMNS.map((c) => [c, c === "created" || c === "updated" ? Number(rows[i][c]) : rows[i][c]]),
    );
    assert.deepEqual(JSON.parse(String(r.payload)), want);
  }
  // A table made before payloads existed gets none.
  assert.ok(!memoryArrow(schemaFor(4, false), rows).schema.fields.some((f) => f.name === "payload"));
  const { text: _, ...noText } = rows[0];
  assert.throws(() => memoryArrow(schemaFor(4), [noText]), /column text is missing/);
});
