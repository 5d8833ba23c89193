// The memory ranking stages on hand-made candidates: fusion (weighted and RRF), temporal decay
// with evergreen memories exempt, the minimum score, and MMR, checked against a naive MMR that
// recomputes everything at every step.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { DEFAULT_RANKING, mmr, rank, type Candidate, type RankOptions } from "../../services/memory/ranking.js";

const NOW = Date.UTC(2026, 10, 22);
const DAY = 86_400_000;

function unit(xs: number[]): Float32Array {
  const n = Math.hypot(...xs);
  return Float32Array.from(xs.map((x) => x / n));
}

const opts = (o: Partial<RankOptions> = {}): RankOptions => ({ ...DEFAULT_RANKING, k: 10, nowMs: NOW, ...o });
const cand = (
  id: string,
  vector: number[],
  vectorScore?: number,
  textScore?: number,
  ageDays = 0,
  evergreen = false,
): Candidate => ({
  id,
  vector: unit(vector),
  vectorScore,
  textScore,
  createdMs: NOW - ageDays * DAY,
  evergreen,
});

describe("fusion", () => {
  test("weighted: 0.7 cosine + 0.3 BM25 scaled by the best BM25 among the candidates", () => {
    const out = rank(
      [cand("a", [1, 0], 0.8, 10), cand("b", [0, 1], 0.5), cand("c", [1, 1], undefined, 5)],
      opts({ mmrLambda: 1, halfLifeDays: 0 }),
    );
    const by = Object.fromEntries(out.map((r) => [r.id, r.stages.fused]));
    assert.ok(Math.abs(by.a - (0.7 * 0.8 + 0.3 * 1)) < 1e-9);
    assert.ok(Math.abs(by.b - 0.7 * 0.5) < 1e-9);
    assert.ok(Math.abs(by.c - 0.3 * 0.5) < 1e-9);
    assert.deepEqual(
      out.map((r) => r.id),
      ["a", "b", "c"],
    );
  });

  test("rrf: 1/(60 + rank) summed over the lists a candidate is in", () => {
    const out = rank(
      [cand("a", [1, 0], 0.9, 1), cand("b", [0, 1], 0.8, 3), cand("c", [1, 1], undefined, 2)],
      opts({ fusion: "rrf", mmrLambda: 1, halfLifeDays: 0 }),
    );
    const by = Object.fromEntries(out.map((r) => [r.id, r.stages.fused]));
    assert.ok(Math.abs(by.a - (1 / 61 + 1 / 63)) < 1e-12);
    assert.ok(Math.abs(by.b - (1 / 62 + 1 / 61)) < 1e-12);
    assert.ok(Math.abs(by.c - 1 / 62) < 1e-12);
    assert.deepEqual(
      out.map((r) => r.id),
      ["b", "a", "c"],
    );
  });
});

describe("decay and the minimum score", () => {
  test("a 30-day-old memory weighs half; an evergreen one does not fade; below min_score is dropped", () => {
    const out = rank(
      [
        cand("new", [1, 0], 0.6),
        cand("old", [0, 1], 0.6, undefined, 30),
        cand("kept", [1, 1], 0.6, undefined, 300, true),
        cand("ancient", [1, 2], 0.6, undefined, 120),
      ],
      opts({ mmrLambda: 1, minScore: 0.1 }),
    );
    const by = Object.fromEntries(out.map((r) => [r.id, r.stages.decayed / r.stages.fused]));
    assert.ok(Math.abs(by.new - 1) < 1e-9);
    assert.ok(Math.abs(by.old - 0.5) < 1e-9);
    assert.equal(by.kept, 1);
    assert.ok(!("ancient" in by), "0.42 * 2^-4 = 0.026 is under the minimum");
  });
});

describe("MMR", () => {
  test("near-duplicates give way to a different relevant memory; lambda 1 keeps relevance order", () => {
    // Relevance is min-max normalised over the pool, so the pool's weakest candidate ("noise") sets the floor.
    const cands = [
      cand("tea-1", [1, 0.01, 0, 0], 0.9),
      cand("tea-2", [1, 0.02, 0, 0], 0.89),
      cand("tea-3", [1, 0, 0.01, 0], 0.88),
      cand("dog", [0, 0, 1, 0], 0.85),
      cand("noise", [0, 0, 0, 1], 0.3),
    ];
    assert.deepEqual(
      rank(cands, opts({ k: 2, mmrLambda: 1, halfLifeDays: 0 })).map((r) => r.id),
      ["tea-1", "tea-2"],
    );
    assert.deepEqual(
      rank(cands, opts({ k: 2, halfLifeDays: 0 })).map((r) => r.id),
      ["tea-1", "dog"],
    );
  });

  test("the incremental form picks what the naive one does (200 random pools)", () => {
    let s = 12345;
    const rand = () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
    const naive = (vs: Float32Array[], rel: number[], k: number, lambda: number) => {
      const lo = Math.min(...rel);
      const hi = Math.max(...rel);
      const norm = rel.map((r) => (hi > lo ? (r - lo) / (hi - lo) : 1));
      const picked: number[] = [];
      while (picked.length < Math.min(k, vs.length)) {
        let best = -1;
        let bestV = -Infinity;
        for (let i = 0; i < vs.length; i++) {
          if (picked.includes(i)) continue;
          const sim =
            picked.length === 0
              ? 0
              : Math.max(...picked.map((j) => vs[i].reduce((acc, x, d) => acc + x * vs[j][d], 0)));
          const v = lambda * norm[i] - (1 - lambda) * sim;
          if (v > bestV || (v === bestV && best >= 0 && norm[i] > norm[best])) {
            best = i;
            bestV = v;
          }
        }
        picked.push(best);
      }
      return picked;
    };
    for (let trial = 0; trial < 200; trial++) {
      const n = 5 + Math.floor(rand() * 60);
      const vs = Array.from({ length: n }, () => unit(Array.from({ length: 16 }, () => rand() - 0.5)));
      const rel = Array.from({ length: n }, () => rand());
      const k = 1 + Math.floor(rand() * 12);
      const lambda = rand();
      assert.deepEqual(mmr(vs, rel, k, lambda).order, naive(vs, rel, k, lambda), `trial ${trial}`);
    }
  });

  test("empty pools and k larger than the pool", () => {
    assert.deepEqual(rank([], opts()), []);
    assert.equal(rank([cand("only", [1, 0], 0.5)], opts({ k: 5 })).length, 1);
  });
});
