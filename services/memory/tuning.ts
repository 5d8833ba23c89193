// The figures the memory store decides by: when to index, how hard to probe, when to rewrite,
// maintain and retire. The measurements behind them are in docs/memory.md and bench/history.md.
import * as lancedb from "@lancedb/lancedb";

export const INDEX_THRESHOLD = 100_000;
/**
 * LanceDB's metadata cache (manifests and file metadata, per table version) by default holds up to
 * 1 GB, and every commit adds its version's entries: the memory service grew by about 38 KB per
 * commit until it would be full (bench/lance-growth). The current version's entries are what
 * searches and writes need, so a small cap costs nothing measurable; TROUPE_MEMORY_METADATA_CACHE_MB.
 */
export const DEFAULT_METADATA_CACHE_BYTES = 32 * 1024 * 1024;
/**
 * The cap on LanceDB's index cache (its own default is 6 GB, over the 4-GiB limit the memory
 * service's pod has). At a million rows the vector index is some 40 MB (an estimate); the cap bounds the
 * service, it does not shape its searches (docs/memory.md).
 */
export const DEFAULT_INDEX_CACHE_BYTES = 1024 * 1024 * 1024;
/**
 * What is left per commit with the caches capped is native memory that goes with the connection
 * (lance-format/lance#1983): the store opens the database anew after this many commits
 * (bench/lance-growth --reconnect-every; docs/memory.md, "Writes"). TROUPE_MEMORY_RECONNECT_COMMITS.
 */
export const DEFAULT_RECONNECT_COMMITS = 200;

/** Sizes a store decides by; tests make them small to reach the large-table paths quickly. */
export interface StoreTuning {
  /** Rows from which the table gets a vector index and is kept in scope order. */
  indexThreshold: number;
  /** Scopes up to this size are always searched exactly (vectorCandidates says why). */
  exactScopeRows: number;
  /**
   * The recall@10 against exact search that searches through the vector index are to keep: the
   * store probes as many partitions as its watch of the index found this needs, and reports an
   * index that no probe count it tries brings this far (watchIndex).
   */
  minIndexRecall: number;
  /** The most callers' adds one commit takes (group-commit.ts); 1 commits each add alone. */
  maxAddGroup: number;
  /** The cap on LanceDB's metadata cache (meta.ts connectMemoryDb). */
  metadataCacheBytes: number;
  /** The cap on LanceDB's index cache (meta.ts connectMemoryDb). */
  indexCacheBytes: number;
  /** Commits after which the database is opened anew (maintenance.ts reconnect); 0: never. */
  reconnectCommits: number;
  /**
   * The least time between two openings anew. The handles an opening replaces are closed
   * RETIRE_AFTER_MS later, so with this at that figure at most one replaced set waits at a time.
   */
  reconnectMinMs: number;
}
/** Handles a rewrite or an opening anew replaced are closed this long after (a rewritten-away table is also dropped), once searches begun on them are done. */
export const RETIRE_AFTER_MS = 30_000;
export const DEFAULT_TUNING: StoreTuning = {
  indexThreshold: INDEX_THRESHOLD,
  exactScopeRows: 2_000,
  minIndexRecall: 0.95,
  maxAddGroup: 64,
  metadataCacheBytes: DEFAULT_METADATA_CACHE_BYTES,
  indexCacheBytes: DEFAULT_INDEX_CACHE_BYTES,
  reconnectCommits: DEFAULT_RECONNECT_COMMITS,
  reconnectMinMs: RETIRE_AFTER_MS,
};
/** The table is rewritten in scope order once it has grown by this fraction since the last time. */
export const LAYOUT_GROWTH = 0.25;
/** A failed rewrite is tried again after this long (until then, the vector index is built alone). */
export const RELAYOUT_RETRY_MS = 3600_000;
export const SCALAR_INDEXES: [string, () => lancedb.Index][] = [
  ["id", () => lancedb.Index.btree()],
  ["content_hash", () => lancedb.Index.btree()],
  ["owner", () => lancedb.Index.btree()],
  ["tenant", () => lancedb.Index.bitmap()],
  ["agent_id", () => lancedb.Index.bitmap()],
];
/** Writes between two optimize() runs (compaction, index catch-up)... */
export const OPTIMIZE_EVERY = 20;
/**
 * ...and the least time between two. Under a steady stream of writes (a bulk load) maintenance
 * would otherwise run every few seconds, each time compacting and catching indexes up on a larger
 * table, and take most of the load's time: at a million rows it cut ingest from over 5,000/s to
 * 1,436/s. The first run comes after OPTIMIZE_EVERY writes, so the scalar indexes that keep
 * dedupe and scope lookups cheap exist early.
 */
export const MAINTAIN_INTERVAL_MS = 30_000;
/** Vector search through the index (vectorCandidates says why). */
export const PROBE_ROWS_FACTOR = 5;
/**
 * 8 of the 122 partitions at a million memories. The watch learns the probes owners' scopes need,
 * but it checks no scope over INDEX_WATCH_MAX_SCOPE, so the tenant's searches get the scale it
 * learnt on smaller ones: with a floor of 4, the watch found 0.997 at 1x and the tenant's searches
 * then served 0.956; with 8 they served 0.989 (bench/memory, two builds).
 */
export const MIN_PROBES = 8;
/**
 * Candidates re-scored on their full vectors, as a multiple of the limit: CHECKED_REFINE_FACTOR
 * for a scope no larger than the largest the last watch checked (checkedUpTo), REFINE_FACTOR for
 * any other, whose recall no watch measured. Each re-scored candidate is a read of its own. Over
 * the 122-partition index at a million memories, 5 probes found the same 0.965 of an owner's top ten at refine 2, 4 and 10
 * (10.5, 11.7 and 14.9 ms), and the watch measures the recall of these searches anyway; the
 * tenant's needed the refine (0.940 at 2, 0.990 at 10), and nothing checks those.
 */
export const REFINE_FACTOR = 10;
export const CHECKED_REFINE_FACTOR = 2;
/**
 * Rows per IVF partition of the vector index: Lance's own target for IVF_PQ. optimize() keeps
 * an index near it: a partition of fewer than a quarter of it (2,048 rows) is joined into its
 * neighbours, one of more than four times it (32,768) is split. An index built with many
 * smaller partitions is remade by the next optimize(): at a million memories, the square root
 * (1,000 partitions of about 1,000 rows) became 31 partitions of about 32,000, searched with
 * probe counts computed for 1,000. Every probe then read most of the index, and an owner's
 * search through it took 26 to 33 ms, a tenant-wide one 150 to 260 ms. Built at this size, the
 * same index kept 113 of its 122 partitions through optimize().
 */
export const PARTITION_ROWS = 8192;
/** Dimensions per PQ sub-vector of the vector index (buildVectorIndex says why 4). */
export const SUB_VECTOR_DIMS = 4;
/** The first searches through a new (or newly compacted) vector index that are checked against exact search (watchIndex). */
export const INDEX_WATCH_SEARCHES = 32;
/** The probe counts a watch tries, as multiples of the probe rule's (indexedSearch). */
export const PROBE_SCALES = [1, 2, 4, 8] as const;
/** Larger scopes are not checked: an exact search of one costs a second or more at a million memories. */
export const INDEX_WATCH_MAX_SCOPE = 100_000;
/** Whether a watch of the index takes searches of a scope this large to check. */
export const watchable = (scopeRows: number): boolean => scopeRows <= INDEX_WATCH_MAX_SCOPE;
/**
 * How long a scope's row count is trusted, and how many scopes' counts are kept. Counting costs a
 * LanceDB query (1.3 ms at 1M memories) on the vector search's critical path, and a user's
 * session searches the same scope turn after turn. A count gone stale by additions is low: the
 * search then probes more partitions than it needs or stays exact, slower but never worse. Deletes
 * are what could make it high (too few probes), so every delete forgets all counts.
 */
export const SCOPE_SIZE_TTL_MS = 5 * 60_000;
export const SCOPE_SIZES_KEPT = 10_000;
/** Writes have paused when none came for this long (the vector index is built then). */
export const WRITES_PAUSE_MS = 10_000;
