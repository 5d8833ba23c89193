// The vector index: how it is built, and how the store learns to serve from it. An index can
// serve far worse than its build promised and nothing LanceDB reports says so, and whether exact
// search beats it depends on how the table lies; so the first searches after a build, a
// compaction under it or a start are checked against exact search, and the plan (probes, which
// scopes go exact) follows what they showed. Measurements and history: docs/memory.md, "Writes".
import * as lancedb from "@lancedb/lancedb";
import type { Logger } from "../shared/process/log.js";
import {
  type IndexServing,
  type IndexWatch,
  type SearchPlan,
  exactSearch,
  indexedSearch,
  partitionsFor,
  planFrom,
  recallOf,
  subVectorsFor,
} from "./search-plan.js";
import { CHECKED_REFINE_FACTOR, INDEX_WATCH_SEARCHES, PROBE_SCALES, type StoreTuning, watchable } from "./tuning.js";

/**
 * Builds (or replaces) the IVF_PQ index: cosine, partitions of about PARTITION_ROWS rows (the
 * size optimize() keeps), one PQ code byte per SUB_VECTOR_DIMS dimensions. Takes both cores for
 * minutes at a million rows; the caller runs it outside the writer's queue.
 */
export async function buildVectorIndex(table: lancedb.Table, dim: number, logger: Logger): Promise<void> {
  const rows = await table.countRows();
  const t0 = Date.now();
  await table.createIndex("vector", {
    config: lancedb.Index.ivfPq({
      distanceType: "cosine",
      numPartitions: partitionsFor(rows),
      numSubVectors: subVectorsFor(dim),
    }),
    replace: true,
  });
  logger.info(`built the vector index over ${rows} memories in ${Date.now() - t0} ms`);
}

/** The watch of the index in use and the plan it decided. One per store. */
export class IndexWatcher {
  private watch?: IndexWatch;
  /** How vector searches are served, as the last finished watch decided. */
  plan: SearchPlan;
  /**
   * The largest scope the last finished watch checked: scopes up to it are re-scored at
   * CHECKED_REFINE_FACTOR, which the watch measured; larger ones at REFINE_FACTOR.
   */
  checkedUpTo = 0;

  /** @param stopped whether the store closed (checks then stop). Contract: never throws. */
  constructor(
    private readonly tuning: StoreTuning,
    private readonly logger: Logger,
    private readonly stopped: () => boolean,
  ) {
    this.plan = { probeScale: 1, exactUpTo: tuning.exactScopeRows };
  }

  /** The index in use is new, was compacted under, or was opened: its next searches are watched. */
  restart(after: string): void {
    const perScale = () => PROBE_SCALES.map(() => [] as number[]);
    this.watch = {
      after,
      taken: 0,
      searches: 0,
      largestScope: 0,
      hits: PROBE_SCALES.map(() => 0),
      total: 0,
      indexedMs: perScale(),
      exactMsPerRow: [],
      checks: Promise.resolve(),
    };
  }

  /**
   * Offers a search just served of a scope of `scopeRows` rows. One of the first
   * INDEX_WATCH_SEARCHES of a watchable scope is checked in the background, one at a time: exact
   * search, timed, then the index at each of PROBE_SCALES, timed, against exact search's top ten.
   * When the last is checked the plan is decided. Contract: never throws; returns at once.
   */
  offer(
    table: lancedb.Table,
    partitions: number,
    scopeWhere: string,
    scopeRows: number,
    vector: Float32Array,
    limit: number,
  ): void {
    const watch = this.watch;
    if (!watch || watch.taken >= INDEX_WATCH_SEARCHES || !watchable(scopeRows)) return;
    watch.taken++;
    watch.largestScope = Math.max(watch.largestScope, scopeRows);
    const query = Float32Array.from(vector);
    const timed = async (q: lancedb.VectorQuery, rows: number) => {
      const t0 = performance.now();
      const found = (await q.select(["id", "_distance"]).limit(rows).toArray()) as { id: string }[];
      return { ids: found.map((r) => r.id), ms: performance.now() - t0 };
    };
    watch.checks = watch.checks
      .then(async () => {
        if (this.stopped() || this.watch !== watch) return;
        const exact = await timed(exactSearch(table, scopeWhere, query), 10);
        watch.exactMsPerRow.push(exact.ms / scopeRows);
        for (const [i, scale] of PROBE_SCALES.entries()) {
          const served = await timed(
            indexedSearch(table, scopeWhere, query, limit, partitions, scopeRows, scale, CHECKED_REFINE_FACTOR),
            limit,
          );
          const top = new Set(served.ids.slice(0, 10));
          watch.hits[i] += exact.ids.filter((id) => top.has(id)).length;
          watch.indexedMs[i].push(served.ms);
        }
        watch.total += exact.ids.length;
        if (++watch.searches === INDEX_WATCH_SEARCHES) this.decide(watch);
      })
      .catch((err: unknown) =>
        this.logger.warn("could not check a search of the vector index against exact search", {
          error: String((err as Error)?.message ?? err),
        }),
      );
  }

  /** Serves by what a finished watch measured (planFrom), and says so in the log. */
  private decide(watch: IndexWatch): void {
    const { plan, met, recalls, indexedMs, exactMsPerRow } = planFrom(watch, this.tuning);
    this.plan = plan;
    this.checkedUpTo = watch.largestScope;
    const tried = PROBE_SCALES.map((scale, i) => `${recalls[i].toFixed(3)} at ${scale}x`).join(", ");
    const verdict =
      `the vector index served recall@10 ${tried} the probe rule's count against exact search on its first ${watch.searches} searches since ${watch.after}; ` +
      `probing ${plan.probeScale}x from now (p50 ${indexedMs.toFixed(1)} ms), and searching scopes of up to ${plan.exactUpTo} rows exactly (${(exactMsPerRow * 1000).toFixed(2)} ms per 1,000 rows)`;
    if (met) this.logger.info(verdict);
    else
      this.logger.warn(
        `${verdict}; no probe count tried reached ${this.tuning.minIndexRecall}: searches find fewer of the nearest memories than they should (docs/memory.md)`,
      );
  }

  /**
   * How the index in use serves, once the checks so far are done: what began the watch, the
   * searches checked, recall@10 at the scale in use and at each scale tried, and the plan. Null
   * before any index.
   */
  async serving(): Promise<IndexServing | null> {
    const watch = this.watch;
    if (!watch) return null;
    await watch.checks;
    const tried = PROBE_SCALES.map((probeScale, i) => ({ probeScale, recall: recallOf(watch, i) }));
    const recall = tried.find((t) => t.probeScale === this.plan.probeScale)?.recall;
    return { after: watch.after, searches: watch.searches, recall, tried, ...this.plan, checkedUpTo: this.checkedUpTo };
  }
}
