// How a search runs against the vector index: what the index watch measured, the plan it chose
// (probes, exact search below a scope size), and the two ways a scope is searched.
import type * as lancedb from "@lancedb/lancedb";
import { pct } from "./stats.js";
import {
  type StoreTuning,
  PROBE_ROWS_FACTOR,
  MIN_PROBES,
  PARTITION_ROWS,
  SUB_VECTOR_DIMS,
  PROBE_SCALES,
  INDEX_WATCH_MAX_SCOPE,
} from "./tuning.js";
import type { MemoryRow, StoredMemory, StoredCandidate } from "./memory-schema.js";

/** A commit that lost a race with another (LanceDB's optimistic concurrency): worth trying again. */
export const isConflict = (err: unknown): boolean => /conflict|retries/i.test(String((err as Error)?.message ?? err));

/** Runs fn, again after a short backoff (20 ms, doubling) while it loses commit races, at most `attempts` times. */
export async function retryConflicts<T>(fn: () => Promise<T>, attempts: number): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (err) {
      if (attempt >= attempts || !isConflict(err)) throw err;
      await new Promise((r) => setTimeout(r, 20 * 2 ** (attempt - 1)));
    }
  }
}

/** PQ sub-vectors for vectors of `dim` dimensions: about one per SUB_VECTOR_DIMS, a divisor of dim (as LanceDB requires). */
export function subVectorsFor(dim: number): number {
  for (let n = Math.max(1, Math.floor(dim / SUB_VECTOR_DIMS)); n > 1; n--) if (dim % n === 0) return n;
  return 1;
}

/** IVF partitions for an index over this many rows: about PARTITION_ROWS each. */
export const partitionsFor = (rows: number): number => Math.max(1, Math.round(rows / PARTITION_ROWS));

/** What a watch of the vector index measured (MemoryStore.watchIndex). */
export interface WatchFigures {
  /** Per probe scale (PROBE_SCALES): hits in exact search's top tens, and each search's time. */
  hits: number[];
  indexedMs: number[][];
  /** The size of exact search's top tens, and each exact search's time per row of its scope. */
  total: number;
  exactMsPerRow: number[];
}

/** The checks of a vector index's first searches (MemoryStore.watchIndex). */
export interface IndexWatch extends WatchFigures {
  /** What began this watch: a new index, a compaction under it, the store's start. */
  after: string;
  /** Searches taken for checking, and those checked so far. */
  taken: number;
  searches: number;
  /** The largest scope among the searches taken, in rows. */
  largestScope: number;
  /** The checks, one after another. */
  checks: Promise<void>;
}

/** How vector searches are served (planFrom). */
export interface SearchPlan {
  /** Partitions probed, as a multiple of the probe rule's count (PROBE_SCALES). */
  probeScale: number;
  /** Scopes of up to this many rows are searched exactly. */
  exactUpTo: number;
}

export type IndexServing = {
  after: string;
  searches: number;
  recall: number | undefined;
  tried: { probeScale: number; recall: number | undefined }[];
  /** Scopes of up to this many rows re-score CHECKED_REFINE_FACTOR times the limit, larger ones REFINE_FACTOR (0: none yet). */
  checkedUpTo: number;
} & SearchPlan;

/**
 * The plan a finished watch's figures call for: the smallest probe scale whose recall@10 reached
 * tuning.minIndexRecall (the largest tried if none did: `met` false), and exact search for every
 * scope it should take less time to search exactly than through the index at that scale, by the
 * medians of the watch's timings (at least tuning.exactScopeRows rows, at most the largest scope
 * a watch checks: exact search's cost is measured per row and may not stay linear far beyond).
 */
export function planFrom(
  figures: WatchFigures,
  tuning: Pick<StoreTuning, "minIndexRecall" | "exactScopeRows">,
): { plan: SearchPlan; met: boolean; recalls: number[]; indexedMs: number; exactMsPerRow: number } {
  const recalls = PROBE_SCALES.map((_, i) => recallOf(figures, i) ?? 1);
  const fit = recalls.findIndex((r) => r >= tuning.minIndexRecall);
  const chosen = fit === -1 ? PROBE_SCALES.length - 1 : fit;
  const indexedMs = median(figures.indexedMs[chosen]);
  const exactMsPerRow = median(figures.exactMsPerRow);
  const cheaperExact = exactMsPerRow > 0 ? Math.floor(indexedMs / exactMsPerRow) : INDEX_WATCH_MAX_SCOPE;
  const exactUpTo = Math.min(INDEX_WATCH_MAX_SCOPE, Math.max(tuning.exactScopeRows, cheaperExact));
  return { plan: { probeScale: PROBE_SCALES[chosen], exactUpTo }, met: fit !== -1, recalls, indexedMs, exactMsPerRow };
}

/** The share of exact search's top tens the checked searches found at one probe scale: none before a check. */
export const recallOf = (figures: WatchFigures, scale: number): number | undefined =>
  figures.total === 0 ? undefined : figures.hits[scale] / figures.total;

/** 0 for no timings, so an empty watch never looks cheap to decide from. */
export const median = (xs: number[]): number => (xs.length === 0 ? 0 : pct(xs, 50));

/**
 * A search of a scope through the IVF_PQ index (vectorCandidates says why these figures): enough
 * partitions probed to meet about PROBE_ROWS_FACTOR times the limit of the scope's rows (at least
 * MIN_PROBES), times the probe scale the store's watch of the index chose, and the best
 * limit * refine re-scored on their full vectors. The caller sets the limit and columns.
 */
export function indexedSearch(
  table: lancedb.Table,
  scopeWhere: string,
  vector: Float32Array,
  limit: number,
  partitions: number,
  scopeRows: number,
  probeScale: number,
  refine: number,
): lancedb.VectorQuery {
  const probes = Math.min(
    partitions,
    probeScale * Math.max(MIN_PROBES, Math.ceil((PROBE_ROWS_FACTOR * limit * partitions) / scopeRows)),
  );
  return table.vectorSearch(vector).distanceType("cosine").where(scopeWhere).nprobes(probes).refineFactor(refine);
}

/** A search of a scope that compares the vector with each of its rows. */
export function exactSearch(table: lancedb.Table, scopeWhere: string, vector: Float32Array): lancedb.VectorQuery {
  return table.vectorSearch(vector).distanceType("cosine").where(scopeWhere).bypassVectorIndex();
}

/** A candidate search's row: the payload and the vector, or (a table without payloads) the memory's columns and the vector. */
export type CandidateRow = Pick<MemoryRow, "vector"> & ({ payload: string } | StoredMemory);

/**
 * The memory of a candidate row: parsed from its payload, or the row itself, whose fields Arrow
 * decodes when they are read.
 */
export function candidateOf(row: CandidateRow, scores: { vectorScore?: number; textScore?: number }): StoredCandidate {
  const memory =
    "payload" in row && typeof row.payload === "string"
      ? (JSON.parse(row.payload) as StoredMemory)
      : (row as StoredMemory);
  // LanceDB returns each vector as an Arrow vector over the batch's values; toArray() is a view
  // of them (Float32Array.from would copy through Arrow's per-element iterator: about 1 ms for 40).
  const vector =
    row.vector instanceof Float32Array ? row.vector : (row.vector as unknown as { toArray(): Float32Array }).toArray();
  return {
    id: memory.id,
    vector,
    createdMs: Number(memory.created),
    evergreen: Boolean(memory.evergreen),
    memory,
    ...scores,
  };
}
