// How candidates from the vector and the full-text searches become the few memories a prompt
// gets: fusion of the two scores, temporal decay, a minimum score, then maximal marginal
// relevance (MMR) so the results are relevant and not repetitive. Pure functions over candidates;
// the service fetches them (memory/server.ts).
//
//   fused   weighted: wv * cosine + wt * bm25 / max bm25 among the candidates (defaults 0.7 / 0.3),
//           or rrf: sum of 1 / (rrfK + rank) over the lists a candidate is in;
//   decayed fused * 2^(-age / halfLife), evergreen memories exempt (halfLife 0: off);
//   MMR     greedy: pick argmax  lambda * rel(i) - (1 - lambda) * max_{j picked} cos(i, j),
//           rel = decayed, min-max normalised over the pool. lambda 1 is pure relevance, 0 pure
//           diversity. Incremental: each candidate keeps its highest similarity to the picked
//           set, updated against the newest pick only: O(n * k) dot products.

export type Fusion = "weighted" | "rrf";

export interface Candidate {
  id: string;
  /** L2-normalised embedding, so a dot product is the cosine. */
  vector: Float32Array;
  /** Cosine similarity to the query, when the vector search found it. */
  vectorScore?: number;
  /** BM25 score, when the full-text search found it. */
  textScore?: number;
  createdMs: number;
  evergreen: boolean;
}

export interface RankOptions {
  k: number;
  fusion: Fusion;
  vectorWeight: number;
  textWeight: number;
  rrfK: number;
  /** Half-life of a memory's weight, in days; 0 turns decay off. */
  halfLifeDays: number;
  /** 1 turns MMR off (relevance order). */
  mmrLambda: number;
  minScore: number;
  nowMs: number;
}

export const DEFAULT_RANKING: Omit<RankOptions, "k" | "nowMs"> = {
  fusion: "weighted",
  vectorWeight: 0.7,
  textWeight: 0.3,
  rrfK: 60,
  halfLifeDays: 30,
  mmrLambda: 0.7,
  minScore: 0,
};

export interface StageScores {
  vector: number;
  text: number;
  fused: number;
  decayed: number;
  /** The MMR value at the moment the memory was picked (equal to decayed when MMR is off). */
  mmr: number;
}

export interface Ranked {
  id: string;
  score: number;
  stages: StageScores;
}

const DAY_MS = 86_400_000;

function fuse(cands: readonly Candidate[], o: RankOptions): number[] {
  if (o.fusion === "rrf") {
    const rankIn = (score: (c: Candidate) => number | undefined) => {
      const order = cands
        .map((c, i) => [score(c), i] as const)
        .filter(([s]) => s !== undefined)
        .sort((a, b) => b[0]! - a[0]!);
      const ranks = new Map<number, number>();
      for (const [r, [, i]] of order.entries()) ranks.set(i, r + 1);
      return ranks;
    };
    const v = rankIn((c) => c.vectorScore);
    const t = rankIn((c) => c.textScore);
    return cands.map((_, i) => (v.has(i) ? 1 / (o.rrfK + v.get(i)!) : 0) + (t.has(i) ? 1 / (o.rrfK + t.get(i)!) : 0));
  }
  const maxText = Math.max(0, ...cands.map((c) => c.textScore ?? 0));
  const total = o.vectorWeight + o.textWeight || 1;
  return cands.map(
    (c) =>
      (o.vectorWeight * Math.max(0, c.vectorScore ?? 0) +
        o.textWeight * (maxText > 0 ? (c.textScore ?? 0) / maxText : 0)) /
      total,
  );
}

export function dot(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

/**
 * Greedy MMR over `rel` (any scale; normalised here), k picks. Returns the picked indices in
 * order and the MMR value each had when picked.
 */
export function mmr(
  vectors: readonly Float32Array[],
  rel: readonly number[],
  k: number,
  lambda: number,
): { order: number[]; values: number[] } {
  const n = vectors.length;
  const lo = Math.min(...rel);
  const hi = Math.max(...rel);
  const norm = rel.map((r) => (hi > lo ? (r - lo) / (hi - lo) : 1));
  const maxSim = new Float64Array(n).fill(-Infinity);
  const taken = new Uint8Array(n);
  const order: number[] = [];
  const values: number[] = [];
  for (let step = 0; step < Math.min(k, n); step++) {
    let best = -1;
    let bestValue = -Infinity;
    for (let i = 0; i < n; i++) {
      if (taken[i]) continue;
      const penalty = step === 0 ? 0 : maxSim[i];
      const value = lambda * norm[i] - (1 - lambda) * penalty;
      // Ties go to the more relevant candidate, then the earlier one.
      if (value > bestValue || (value === bestValue && best >= 0 && norm[i] > norm[best])) {
        best = i;
        bestValue = value;
      }
    }
    taken[best] = 1;
    order.push(best);
    values.push(bestValue);
    const picked = vectors[best];
    for (let i = 0; i < n; i++) if (!taken[i]) maxSim[i] = Math.max(maxSim[i], dot(vectors[i], picked));
  }
  return { order, values };
}

/** Fusion, decay, minimum score, then MMR: the top k with every stage's score. */
export function rank(cands: readonly Candidate[], o: RankOptions): Ranked[] {
  if (cands.length === 0) return [];
  const fused = fuse(cands, o);
  const decayed = cands.map((c, i) => {
    if (o.halfLifeDays <= 0 || c.evergreen) return fused[i];
    const ageDays = Math.max(0, o.nowMs - c.createdMs) / DAY_MS;
    return fused[i] * 0.5 ** (ageDays / o.halfLifeDays);
  });
  const pool = cands.map((_, i) => i).filter((i) => decayed[i] >= o.minScore);
  if (pool.length === 0) return [];
  const stages = (i: number, m: number): StageScores => ({
    vector: cands[i].vectorScore ?? 0,
    text: cands[i].textScore ?? 0,
    fused: fused[i],
    decayed: decayed[i],
    mmr: m,
  });
  if (o.mmrLambda >= 1) {
    return pool
      .sort((a, b) => decayed[b] - decayed[a])
      .slice(0, o.k)
      .map((i) => ({ id: cands[i].id, score: decayed[i], stages: stages(i, decayed[i]) }));
  }
  const { order, values } = mmr(
    pool.map((i) => cands[i].vector),
    pool.map((i) => decayed[i]),
    o.k,
    o.mmrLambda,
  );
  return order.map((p, j) => {
    const i = pool[p];
    return { id: cands[i].id, score: decayed[i], stages: stages(i, values[j]) };
  });
}
