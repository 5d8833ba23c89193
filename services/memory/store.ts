// The memory table in LanceDB: its schema, the one writer that changes it, its maintenance, and
// the two candidate searches (vector and full text) that ranking.ts turns into results.
//
// - One writer per table: every change goes through a promise chain, so this process never races
//   itself; a commit conflict with another process is retried a few times with backoff.
// - Each add is one LanceDB commit (a new version): a batch lands whole or not at all, and a crash
//   in the middle leaves the table at its previous version.
// - Equal texts in one scope are stored once (content_hash of the normalised text).
// - A vector index (IVF_PQ) is built once the table passes INDEX_THRESHOLD rows; below it every
//   search is exact, and so is a search of a small scope after it. The store checks the index's
//   first searches against exact search and serves by what they show (watchIndex): the probes
//   that keep the recall, and exact search where it is cheaper. The full-text index is made
//   with the table; rows added since the last optimize() are searched without the index until
//   the next one, which runs every few writes.
// - Past the threshold, the table is rewritten in scope order from time to time (layout.ts), and
//   readers switch to the copy through the pointer in META_TABLE.
// - Every stored vector carries the embedder that made it; a table made by another embedder is
//   refused rather than searched with vectors from two spaces. `troupe memory reembed`
//   (reembed.ts) migrates: it writes a new table and switches the pointer in META_TABLE to it in
//   one commit, so a reader sees the old table or the new one, never a mix.
import * as lancedb from "@lancedb/lancedb";
import type { Schema } from "apache-arrow";
import { RpcError, Status, failedPrecondition } from "../shared/errors.js";
import type { Logger } from "../shared/log.js";
import { arrowTable } from "./columns.js";
import { copyInScopeOrder, layoutTableName } from "./layout.js";
import {
  type StoreTuning,
  DEFAULT_TUNING,
  LAYOUT_GROWTH,
  RELAYOUT_RETRY_MS,
  RETIRE_AFTER_MS,
  SCALAR_INDEXES,
  OPTIMIZE_EVERY,
  MAINTAIN_INTERVAL_MS,
  REFINE_FACTOR,
  CHECKED_REFINE_FACTOR,
  INDEX_WATCH_SEARCHES,
  PROBE_SCALES,
  watchable,
  SCOPE_SIZE_TTL_MS,
  SCOPE_SIZES_KEPT,
  WRITES_PAUSE_MS,
} from "./tuning.js";
import {
  TABLE,
  ACTIVE_KEY,
  LAYOUT_ROWS_KEY,
  RETIRED_KEY,
  PENDING_KEY,
  connectMemoryDb,
  readMeta,
  writeMeta,
  indexNewTable,
  HISTORY_TABLE,
  LEGACY_TABLE,
} from "./meta.js";
import {
  type MemoryRow,
  newMemoryRow,
  historySchema,
  EVENT,
  historyRow,
  type HistoryRow,
  schemaFor,
  hasPayload,
  memoryArrow,
  sqlString,
  HashFilter,
  type StoredMemory,
  MEMORY_COLUMNS,
  CANDIDATE_COLUMNS,
  PACKED_CANDIDATE_COLUMNS,
  type StoredCandidate,
} from "./memory-schema.js";
import {
  isConflict,
  retryConflicts,
  subVectorsFor,
  partitionsFor,
  type IndexWatch,
  type SearchPlan,
  type IndexServing,
  planFrom,
  recallOf,
  indexedSearch,
  exactSearch,
  type CandidateRow,
  candidateOf,
} from "./search-plan.js";

export class MemoryStore {
  private table?: lancedb.Table;
  /**
   * The table's name, kept here: LanceDB's name getter throws ("cannot be borrowed mutably while
   * another borrow is active") while an operation is using the table.
   */
  private tableName = TABLE;
  private historyTable?: lancedb.Table;
  private writes: Promise<unknown> = Promise.resolve();
  private sinceOptimize = 0;
  private lastMaintained = 0;
  private lastWrite = 0;
  /** Writes asked for and not finished: while one waits, writes have not paused, however long ago the last one ended. */
  private pendingWrites = 0;
  private pauseTimer?: NodeJS.Timeout;
  /** Rows at the last count plus those added since (deletes aside): enough to know the index is due. */
  private approxRows = 0;
  private hashes?: HashFilter;
  private maintaining?: { mode: "now" | "when idle"; done: Promise<void> };
  private closed = false;
  /** The vector index, once built (known at open and after maintenance; searches read it). */
  private vectorIndex?: { partitions: number };
  private readonly scopeSizes = new Map<string, { rows: number; at: number }>();
  /** Deletes so far: a scope count begun before a delete is not kept (scopeRows). */
  private deletes = 0;
  /** The schema of the table in use (schemaFor, packed unless the table predates payloads). */
  private schema: Schema;
  /** The table's row count at its last rewrite in scope order. */
  private layoutRows = 0;
  /** While a rewrite copies the table: the ids written since the copy's snapshot, to carry over. */
  private changedDuringCopy?: Set<string>;
  private retireTimers = new Set<NodeJS.Timeout>();
  /** When a rewrite last failed: it costs minutes of both cores, so it is not retried at once. */
  private relayoutFailedAt = 0;
  /** How the vector index in use has served its first searches, against exact search (watchIndex). */
  private indexWatch?: IndexWatch;
  /** How vector searches are served, as the last watch of the index decided (watchIndex). */
  private plan: SearchPlan;
  /**
   * The largest scope the last finished watch checked: scopes up to it are re-scored at
   * CHECKED_REFINE_FACTOR, which the watch measured; larger ones, whose recall no watch measured,
   * at REFINE_FACTOR. At 100,000 memories the tenant's scope (100,000 rows, within what a watch
   * may check) served recall@10 0.953 at refine 2 after a watch of owners' scopes of 1,000 rows.
   */
  private checkedUpTo = 0;

  private constructor(
    private readonly db: lancedb.Connection,
    readonly embedder: string,
    readonly dim: number,
    private readonly logger: Logger,
    private readonly tuning: StoreTuning,
  ) {
    this.schema = schemaFor(dim);
    this.plan = { probeScale: 1, exactUpTo: tuning.exactScopeRows };
  }

  static async open(
    uri: string,
    storageOptions: Record<string, string>,
    embedder: string,
    dim: number,
    logger: Logger,
    tuning: Partial<StoreTuning> = {},
  ): Promise<MemoryStore> {
    const db = await connectMemoryDb(uri, storageOptions);
    const store = new MemoryStore(db, embedder, dim, logger, { ...DEFAULT_TUNING, ...tuning });
    await store.init();
    return store;
  }

  private async init(): Promise<void> {
    const names = await this.db.tableNames();
    const meta = await readMeta(this.db);
    const active = meta.get(ACTIVE_KEY) ?? TABLE;
    this.tableName = active;
    if (names.includes(active)) {
      this.table = await this.db.openTable(active);
      await this.checkEmbedder();
      if (!hasPayload(await this.table.schema())) {
        // Written as it is until the next rewrite, which makes the table anew with payloads.
        this.schema = schemaFor(this.dim, false);
        this.logger.info(
          `the memory table ${active} has no payload column (made before it existed): searches read its columns until its next rewrite`,
        );
      }
    } else {
      const t = await this.db.createEmptyTable(active, this.schema, { existOk: true });
      await indexNewTable(t, 0);
      this.table = t;
    }
    this.historyTable = names.includes(HISTORY_TABLE)
      ? await this.db.openTable(HISTORY_TABLE)
      : await this.db.createEmptyTable(HISTORY_TABLE, historySchema, { existOk: true });
    if (names.includes(LEGACY_TABLE)) await this.migrateLegacy();
    // A rewrite's table not in use was left by a run that stopped before its switch; the table a
    // rewrite replaced may outlive a process that ended before dropping it.
    const leftovers = [meta.get(RETIRED_KEY), meta.get(PENDING_KEY)];
    for (const n of names) {
      if (n !== active && leftovers.includes(n)) {
        this.logger.info(`dropping ${n}: a memory table no longer in use (scope-order rewrite)`);
        await this.db.dropTable(n);
      }
    }
    this.layoutRows = Number(meta.get(LAYOUT_ROWS_KEY) ?? 0);
    await this.loadVectorIndex();
    // How an index an earlier process built serves is not known here (the plan is not stored):
    // its first searches decide again.
    if (this.vectorIndex) this.watchIndexAnew("the store opened");
    this.approxRows = await this.t.countRows();
  }

  /** The changes of a scope (or one memory), oldest first. */
  async history(scopeWhere: string, memoryId = ""): Promise<HistoryRow[]> {
    const where = memoryId ? `${scopeWhere} AND memory_id = ${sqlString(memoryId)}` : scopeWhere;
    const rows = (await this.historyTable!.query().where(where).toArray()) as HistoryRow[];
    // Timestamp columns come back as Dates or numbers; Number() makes either milliseconds.
    return rows.map((r) => ({ ...r, time: Number(r.time) })).sort((a, b) => a.time - b.time);
  }

  private async record(changes: HistoryRow[]): Promise<void> {
    if (changes.length > 0) await this.historyTable!.add(arrowTable(historySchema, changes));
  }

  /**
   * The memories of a scope with these ids: every column but the vector and the embedder, which
   * no reader of a whole memory needs (LanceDB reads each column named on its own; at 1M memories
   * each costs a few ms for rows spread over the table).
   */
  async get(scopeWhere: string, ids: string[]): Promise<StoredMemory[]> {
    if (ids.length === 0) return [];
    return (await this.t
      .query()
      .where(`${scopeWhere} AND id IN (${ids.map(sqlString).join(", ")})`)
      .select(MEMORY_COLUMNS)
      .toArray()) as StoredMemory[];
  }

  /** The first version's rows, carried over with defaults for the new columns, then the old table dropped. */
  private async migrateLegacy(): Promise<void> {
    const old = await this.db.openTable(LEGACY_TABLE);
    const rows = (await old.query().toArray()) as (Pick<
      MemoryRow,
      "id" | "tenant" | "owner" | "agent_id" | "session_id" | "kind" | "text" | "embedder"
    > & { vector: Float32Array; created: number | Date })[];
    if (rows.length > 0) {
      if (rows.some((r) => r.embedder !== this.embedder))
        throw new Error(`the memory table ${LEGACY_TABLE} was embedded by ${rows[0].embedder}, not ${this.embedder}`);
      await this.table!.add(
        memoryArrow(
          this.schema,
          rows.map((r) =>
            newMemoryRow({ ...r, created: Number(r.created), updated: Number(r.created), provenance: "migrated" }),
          ),
        ),
      );
    }
    await this.db.dropTable(LEGACY_TABLE);
    this.logger.info(`migrated ${rows.length} memories from ${LEGACY_TABLE} to ${TABLE}`);
  }

  private async checkEmbedder(): Promise<void> {
    const sample = (await this.table!.query().select(["embedder"]).limit(1).toArray()) as { embedder: string }[];
    if (sample.length > 0 && sample[0].embedder !== this.embedder) {
      throw failedPrecondition(
        `the memory table was embedded by ${sample[0].embedder} and this service embeds with ${this.embedder}: vectors of two embedders cannot be compared; re-embed the table (troupe memory reembed, with this service's embedder settings) or configure ${sample[0].embedder}`,
      );
    }
  }

  /** Whether the table in use has payloads (schemaFor). */
  private get packed(): boolean {
    return hasPayload(this.schema);
  }

  private get t(): lancedb.Table {
    return this.table!;
  }

  /** Runs a change after every earlier one, retrying commit conflicts with other writers. */
  private write<T>(fn: () => Promise<T>): Promise<T> {
    const run = async () => {
      try {
        const out = await retryConflicts(fn, 5);
        this.afterWrite();
        return out;
      } finally {
        this.pendingWrites--;
      }
    };
    this.pendingWrites++;
    const next = this.writes.then(run, run);
    this.writes = next.catch(() => undefined);
    return next;
  }

  private afterWrite(): void {
    this.lastWrite = Date.now();
    if (!this.vectorIndex && this.approxRows >= this.tuning.indexThreshold) {
      // Once the writes pause, a maintenance run builds the vector index if the table is due one.
      clearTimeout(this.pauseTimer);
      this.pauseTimer = setTimeout(() => this.maintainInBackground("when idle"), WRITES_PAUSE_MS + 500);
      this.pauseTimer.unref();
    }
    if (++this.sinceOptimize < OPTIMIZE_EVERY || Date.now() - this.lastMaintained < MAINTAIN_INTERVAL_MS) return;
    this.sinceOptimize = 0;
    this.lastMaintained = Date.now();
    // The vector index waits for a pause in writes: built in the middle of a bulk load, it takes
    // the cores the load needs (the next maintenance after the load builds it).
    this.maintainInBackground("when idle");
  }

  /** maintain() for a timer or a write: nobody awaits it, so a failure is logged. */
  maintainInBackground(mode: "now" | "when idle"): void {
    void this.maintain({ vectorIndex: mode }).catch((err: unknown) =>
      this.logger.warn("memory maintenance failed", { error: String((err as Error)?.message ?? err) }),
    );
  }

  /**
   * Compaction and index catch-up; the scalar indexes; the vector index and the rewrite in scope
   * order once the table is large enough. One run at a time (index builds that overlap
   * conflict). A call while one runs joins it, unless it asks for the large-table work "now" and
   * the running one may skip it: then a run follows the current one.
   */
  maintain(options: { vectorIndex: "now" | "when idle" } = { vectorIndex: "now" }): Promise<void> {
    const mode = options.vectorIndex;
    if (this.maintaining && (mode === "when idle" || this.maintaining.mode === "now")) return this.maintaining.done;
    const before = this.maintaining?.done.catch(() => undefined) ?? Promise.resolve();
    const done: Promise<void> = before
      .then(() => this.runMaintenance(mode))
      .finally(() => {
        if (this.maintaining?.done === done) this.maintaining = undefined;
      });
    this.maintaining = { mode, done };
    return done;
  }

  private async runMaintenance(vectorIndex: "now" | "when idle"): Promise<void> {
    if (this.closed) return;
    // Outside the writer's queue: at a million rows a compaction takes seconds, and holding every
    // add for them is what a caller would feel. Adds commit beside a compaction (appends and a
    // rewrite of older fragments do not conflict). An update or delete that commits first makes
    // the compaction's commit fail as a conflict; it is tried again, and after a few lost races
    // left to the next maintenance while the rest of this one goes on.
    const cleanupOlderThan = new Date(Date.now() - 3600_000);
    let compacted = false;
    try {
      compacted =
        (await retryConflicts(() => this.t.optimize({ cleanupOlderThan }), 3)).compaction.fragmentsRemoved > 0;
    } catch (err) {
      if (!isConflict(err)) throw err;
      this.logger.warn("memory compaction lost 3 races with updates; it runs again at the next maintenance");
    }
    // The history only grows; unmaintained, each add commits a manifest listing every earlier one
    // (at 1M memories an add of 1,000 history rows took twice what it took at the start).
    await this.historyTable!.optimize({ cleanupOlderThan });
    const rows = await this.t.countRows();
    this.approxRows = rows;
    const indices = await this.t.listIndices();
    // Scalar indexes make the scope predicate (applied before every search) and the dedupe and
    // upsert lookups cheap instead of a scan of every row.
    for (const [column, config] of SCALAR_INDEXES) {
      if (rows > 0 && !indices.some((i) => i.columns.includes(column))) {
        await this.write(() => this.t.createIndex(column, { config: config(), replace: true }));
      }
    }
    // The rewrite in scope order and the vector index wait for a pause in writes (or a
    // maintenance that asks for them now): each takes the cores for minutes at a million rows.
    // Both run outside the writer's queue, so adds go on meanwhile.
    //
    // A write waiting in the queue means the writes have not paused, even if the last one ended
    // long ago: a step of this maintenance in the writer's queue (a scalar index build) holds the
    // writes back, and must not be taken for a pause that starts a rewrite in the middle of a load.
    const paused = this.pendingWrites === 0 && Date.now() - this.lastWrite >= WRITES_PAUSE_MS;
    const now = vectorIndex === "now" || paused;
    // A table without payloads is rewritten at the first chance: the rewrite makes them.
    const grown = rows >= this.layoutRows * (1 + LAYOUT_GROWTH) || !this.packed;
    const rewriteDue =
      rows >= this.tuning.indexThreshold && grown && Date.now() - this.relayoutFailedAt >= RELAYOUT_RETRY_MS;
    const why = vectorIndex === "now" ? "asked for now" : "writes paused";
    if (now && rewriteDue) {
      this.logger.info(
        `rewriting the memory table in scope order: ${rows} memories, ${this.layoutRows} at the last rewrite (${why})`,
      );
      await this.relayout();
    } else if (now && rows >= this.tuning.indexThreshold && !indices.some((i) => i.columns.includes("vector"))) {
      this.logger.info(`building the vector index: ${rows} memories (${why})`);
      await this.buildVectorIndex(this.t);
      this.watchIndexAnew("a new index");
    } else if (compacted && this.vectorIndex) {
      // A compaction rewrites fragments under the index, and that has spoiled it (watchIndex);
      // so also for an index an earlier process built.
      this.watchIndexAnew("a compaction");
    }
    await this.loadVectorIndex();
  }

  /**
   * Rewrites the table in scope order (layout.ts says why) and switches to the copy:
   *
   * 1. From here on, the writer notes every id it adds, updates or deletes.
   * 2. The table, checked out at its current version, is copied in scope order into a new one,
   *    which is compacted and then gets its full-text, scalar and vector indexes. Searches and
   *    writes use the old table meanwhile.
   * 3. In the writer's queue (no write in flight): the noted ids are carried over (rows that
   *    exist now are upserted into the copy, the others deleted from it), then the pointer moves
   *    to the copy in one commit with the row count of this rewrite.
   *
   * A process that ends before step 3 leaves the old table in use; the copy is dropped at the
   * next start. The old table is dropped RETIRE_AFTER_MS later.
   */
  private async relayout(): Promise<void> {
    const oldName = this.tableName;
    const name = layoutTableName();
    this.changedDuringCopy = new Set();
    let copy: lancedb.Table | undefined;
    try {
      await writeMeta(this.db, { [PENDING_KEY]: name });
      const t0 = Date.now();
      const snapshot = await this.db.openTable(oldName);
      await snapshot.checkout(await snapshot.version());
      const { table, rows } = await copyInScopeOrder(this.db, snapshot, name, schemaFor(this.dim), memoryArrow);
      snapshot.close();
      copy = table;
      // The next maintenance would merge the copy's fragments anyway, and a compaction under a
      // vector index rewrites the index to follow the rows it moved: compact first, then index.
      await copy.optimize({ cleanupOlderThan: new Date() });
      await indexNewTable(copy, rows);
      if (rows >= this.tuning.indexThreshold) await this.buildVectorIndex(copy);
      const switched = copy;
      await this.write(async () => {
        if (this.closed)
          throw new Error("the store was closed during the rewrite; the copy is dropped at the next start");
        this.schema = schemaFor(this.dim);
        await this.carryOver([...this.changedDuringCopy!], switched);
        const count = await switched.countRows();
        await writeMeta(this.db, { [ACTIVE_KEY]: name, [LAYOUT_ROWS_KEY]: String(count), [RETIRED_KEY]: oldName });
        const old = this.table!;
        this.table = switched;
        this.tableName = name;
        this.layoutRows = count;
        this.changedDuringCopy = undefined;
        // The copy is compacted and indexed: no maintenance is due because of this write (a run
        // started now would compete with searches for the cores, for nothing).
        await this.loadVectorIndex();
        if (rows >= this.tuning.indexThreshold) this.watchIndexAnew("a new index");
        clearTimeout(this.pauseTimer);
        this.sinceOptimize = 0;
        this.lastMaintained = Date.now();
        this.retire(old, oldName);
      });
      this.logger.info(`rewrote the memory table in scope order (${rows} memories) in ${Date.now() - t0} ms`);
    } catch (err) {
      this.changedDuringCopy = undefined;
      this.relayoutFailedAt = Date.now();
      if (copy && this.table !== copy) {
        copy.close();
        await this.db.dropTable(name).catch(() => undefined);
      }
      throw err;
    }
  }

  /** Makes the copy hold what the live table holds now for these ids. */
  private async carryOver(ids: string[], copy: lancedb.Table): Promise<void> {
    for (let start = 0; start < ids.length; start += 1000) {
      const part = ids.slice(start, start + 1000);
      const list = part.map(sqlString).join(", ");
      const live = (await this.t.query().where(`id IN (${list})`).toArray()) as MemoryRow[];
      if (live.length > 0)
        await copy
          .mergeInsert("id")
          .whenMatchedUpdateAll()
          .whenNotMatchedInsertAll()
          .execute(memoryArrow(this.schema, live));
      const kept = new Set(live.map((r) => r.id));
      const gone = part.filter((id) => !kept.has(id));
      if (gone.length > 0) await copy.delete(`id IN (${gone.map(sqlString).join(", ")})`);
    }
  }

  /** Drops a replaced table once searches that began on it have had time to finish. */
  private retire(table: lancedb.Table, name: string): void {
    const timer = setTimeout(() => {
      this.retireTimers.delete(timer);
      table.close();
      void this.db
        .dropTable(name)
        .catch((err: unknown) =>
          this.logger.warn(`could not drop the replaced memory table ${name}`, { error: String(err) }),
        );
    }, RETIRE_AFTER_MS);
    timer.unref();
    this.retireTimers.add(timer);
  }

  /**
   * IVF_PQ with partitions of about PARTITION_ROWS rows (why: there), and one PQ code byte per 4
   * dimensions (SUB_VECTOR_DIMS). The figures below are of indexes built with 1,000 partitions at a
   * million memories, which optimize() had remade into 31. With a byte per 8, the index
   * over bench/memory's million memories, compacted into one fragment, served an owner's scope
   * recall@10 0.853 and the tenant 0.800 at the probe rule's 20 probes, and more probes did not
   * save the tenant's searches (0.995 and 0.850 at 40: the codes were too coarse to rank a
   * topic's memories; a refine factor of 50 gave 0.997, at 103 ms). Built with a byte per 4 over
   * the same table: 0.990 and 1.000 at 20 probes (9.2 and 20.4 ms). Builds vary (the bench's
   * since found 0.875 to 0.897 of an owner's top ten at 20 probes, 1.000 at 40, which the watch
   * takes care of), but the tenant's searches stayed at 0.998 to 1.000. The cost is the build
   * (188 to 222 s against 99 to 127 s at a million, on 2 cores) and 64 bytes of index per 256-d
   * memory instead of 32.
   */
  private async buildVectorIndex(table: lancedb.Table): Promise<void> {
    const rows = await table.countRows();
    const t0 = Date.now();
    await table.createIndex("vector", {
      config: lancedb.Index.ivfPq({
        distanceType: "cosine",
        numPartitions: partitionsFor(rows),
        numSubVectors: subVectorsFor(this.dim),
      }),
      replace: true,
    });
    this.logger.info(`built the vector index over ${rows} memories in ${Date.now() - t0} ms`);
  }

  /** The vector index in use is new, was compacted under or was opened: its next searches are watched (watchIndex). */
  private watchIndexAnew(after: string): void {
    const perScale = () => PROBE_SCALES.map(() => [] as number[]);
    this.indexWatch = {
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
   * Takes one of the first INDEX_WATCH_SEARCHES searches of a scope past tuning.exactScopeRows
   * since the vector index was built, compacted under or opened, and checks it in the background,
   * one at a time: exact search of the scope, timed, then the same search through the index at
   * each of PROBE_SCALES times the probe rule's count, timed, with how many of exact search's top
   * ten each found. Once all are checked the store serves by what they showed (decidePlan): the
   * fewest probes that keep tuning.minIndexRecall, and exact search for scopes it found cheaper
   * to search that way.
   *
   * Why the store measures rather than trusts its rules: an index can serve far worse than its
   * build promised, and nothing LanceDB reports says so. At a million memories in bench/memory,
   * an IVF_PQ index over the table compacted into one fragment served recall@10 0.83 to 0.90 in
   * an owner's scope at the rule's 20 probes (0.997 over the same rows in 20 fragments of
   * 50,000), whether the compaction came before the build or after it; rebuilding changed
   * nothing (three builds: 0.831, 0.881, 0.881), 100 probes gave 0.998. (The cause, found later:
   * optimize() had remade those indexes of 1,000 partitions into 31, see PARTITION_ROWS; the
   * watch still guards against what the store cannot see.) A check at build time
   * with stored memories' own vectors as queries told nothing either (1.000 through such an
   * index). And whether exact search of a scope beats the index depends on how the table lies:
   * 9.5 ms for an owner's 10,000 rows in scope order, 100 to 150 ms with the same rows spread in
   * write order. The searches the index is actually asked, timed on the table as it is, tell both.
   */
  private watchIndex(
    table: lancedb.Table,
    scopeWhere: string,
    scopeRows: number,
    vector: Float32Array,
    limit: number,
  ): void {
    const watch = this.indexWatch;
    const index = this.vectorIndex;
    if (!watch || !index || watch.taken >= INDEX_WATCH_SEARCHES || !watchable(scopeRows)) return;
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
        if (this.closed || this.indexWatch !== watch) return;
        const exact = await timed(exactSearch(table, scopeWhere, query), 10);
        watch.exactMsPerRow.push(exact.ms / scopeRows);
        for (const [i, scale] of PROBE_SCALES.entries()) {
          const served = await timed(
            indexedSearch(table, scopeWhere, query, limit, index.partitions, scopeRows, scale, CHECKED_REFINE_FACTOR),
            limit,
          );
          const top = new Set(served.ids.slice(0, 10));
          watch.hits[i] += exact.ids.filter((id) => top.has(id)).length;
          watch.indexedMs[i].push(served.ms);
        }
        watch.total += exact.ids.length;
        if (++watch.searches === INDEX_WATCH_SEARCHES) this.decidePlan(watch);
      })
      .catch((err: unknown) =>
        this.logger.warn("could not check a search of the vector index against exact search", {
          error: String((err as Error)?.message ?? err),
        }),
      );
  }

  /** Serves by what a finished watch measured (planFrom), and says so in the log. */
  private decidePlan(watch: IndexWatch): void {
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
   * How the vector index in use serves, once the checks of its searches so far are done: what
   * began its watch, the searches checked, their recall@10 at the probe scale now used and at each
   * scale tried, and the plan (probe scale, largest scope searched exactly). Null before any index.
   */
  async indexServing(): Promise<IndexServing | null> {
    const watch = this.indexWatch;
    if (!watch) return null;
    await watch.checks;
    const tried = PROBE_SCALES.map((probeScale, i) => ({ probeScale, recall: recallOf(watch, i) }));
    const recall = tried.find((t) => t.probeScale === this.plan.probeScale)?.recall;
    return { after: watch.after, searches: watch.searches, recall, tried, ...this.plan, checkedUpTo: this.checkedUpTo };
  }

  /** The vector index's statistics, if it exists. */
  private async vectorIndexStats(): Promise<lancedb.IndexStatistics | undefined> {
    const idx = (await this.t.listIndices()).find((i) => i.columns.includes("vector"));
    return idx && (await this.t.indexStats(idx.name));
  }

  async vectorIndexed(): Promise<{ indexed: boolean; unindexed: number }> {
    const stats = await this.vectorIndexStats();
    return { indexed: stats !== undefined, unindexed: stats?.numUnindexedRows ?? 0 };
  }

  /** Reads whether the vector index exists, and its partition count for the probe arithmetic. */
  private async loadVectorIndex(): Promise<void> {
    const stats = await this.vectorIndexStats();
    // LanceDB does not report the partition count; the build's own rule, applied to the rows
    // indexed now, gives it, or a few more once optimize() has joined small partitions (113 of
    // 122 at a million memories in bench/memory): more probes, never fewer.
    this.vectorIndex = stats ? { partitions: partitionsFor(stats.numIndexedRows) } : undefined;
  }

  async stats(): Promise<{ rows: number; version: number; indexed: boolean; unindexed: number }> {
    const [rows, version, idx] = await Promise.all([this.t.countRows(), this.t.version(), this.vectorIndexed()]);
    return { rows, version, ...idx };
  }

  /**
   * How the table and its vector index stand, for an operator or a bench reading a figure: rows
   * at the last rewrite in scope order (the rows past them lie in write order), and the index's
   * rows and parts (optimize() adds rows as further parts until the next rewrite).
   */
  async layout(): Promise<{ rows: number; layoutRows: number; indexedRows: number; indexParts: number }> {
    const [rows, idx] = await Promise.all([this.t.countRows(), this.vectorIndexStats()]);
    return {
      rows,
      layoutRows: this.layoutRows,
      indexedRows: idx?.numIndexedRows ?? 0,
      indexParts: idx?.numIndices ?? 0,
    };
  }

  /** Existing rows of a scope with these content hashes or ids: hash -> id, and the rows by id. */
  private async existing(
    scopeWhere: string,
    hashes: string[],
    ids: string[],
  ): Promise<{ byHash: Map<string, string>; byId: Map<string, Pick<MemoryRow, "id" | "text" | "created">> }> {
    const parts: string[] = [];
    if (hashes.length > 0) parts.push(`content_hash IN (${hashes.map(sqlString).join(", ")})`);
    if (ids.length > 0) parts.push(`id IN (${ids.map(sqlString).join(", ")})`);
    const byHash = new Map<string, string>();
    const byId = new Map<string, Pick<MemoryRow, "id" | "text" | "created">>();
    if (parts.length === 0) return { byHash, byId };
    const rows = (await this.t
      .query()
      .where(`${scopeWhere} AND (${parts.join(" OR ")})`)
      .select(["id", "content_hash", "text", "created"])
      .toArray()) as (Pick<MemoryRow, "id" | "text" | "created"> & { content_hash: string })[];
    for (const r of rows) {
      byHash.set(r.content_hash, r.id);
      byId.set(r.id, r);
    }
    return { byHash, byId };
  }

  /** The hash filter, (re)built from the table when missing or full. Called inside the writer's queue. */
  private async hashFilter(adding: number): Promise<HashFilter> {
    if (this.hashes && this.hashes.size + adding <= this.hashes.capacity) return this.hashes;
    const rows = await this.t.countRows();
    const filter = new HashFilter(Math.max(1 << 20, 2 * (rows + adding)));
    for await (const batch of this.t.query().select(["content_hash"])) {
      const column = batch.getChild("content_hash");
      for (let i = 0; i < batch.numRows; i++) filter.add(String(column?.get(i)));
    }
    this.hashes = filter;
    return filter;
  }

  /**
   * Stores a batch in one commit (upserts in one more). Rows whose text is already stored in the
   * scope are skipped as duplicates. Returns, per row, the id it has and what happened.
   */
  add(
    scopeWhere: string,
    rows: MemoryRow[],
    upsertIds: Set<string>,
    actor = "api",
  ): Promise<{ id: string; outcome: "added" | "updated" | "duplicate" }[]> {
    return this.write(async () => {
      const filter = await this.hashFilter(rows.length);
      const { byHash, byId: present } = await this.existing(
        scopeWhere,
        [...new Set(rows.map((r) => r.content_hash).filter((h) => filter.mayHave(h)))],
        [...upsertIds],
      );
      // An id given for a memory of another scope is refused rather than silently forked.
      for (const id of upsertIds) {
        if (!present.has(id) && (await this.t.countRows(`id = ${sqlString(id)}`)) > 0)
          throw new RpcError(Status.PERMISSION_DENIED, `memory ${id} belongs to another scope`);
      }
      const seen = new Map<string, string>();
      const inserts: MemoryRow[] = [];
      const updates: MemoryRow[] = [];
      const out = rows.map((r) => {
        const same = byHash.get(r.content_hash) ?? seen.get(r.content_hash);
        if (same !== undefined && !(upsertIds.has(r.id) && same === r.id))
          return { id: same, outcome: "duplicate" as const };
        seen.set(r.content_hash, r.id);
        if (upsertIds.has(r.id) && present.has(r.id)) {
          updates.push(r);
          return { id: r.id, outcome: "updated" as const };
        }
        inserts.push(r);
        return { id: r.id, outcome: "added" as const };
      });
      if (inserts.length > 0) await this.t.add(memoryArrow(this.schema, inserts));
      this.approxRows += inserts.length;
      for (const r of [...inserts, ...updates]) filter.add(r.content_hash);
      if (updates.length > 0) {
        // An update keeps when the memory was first made.
        const kept = updates.map((u) => ({ ...u, created: Number(present.get(u.id)!.created) }));
        await this.t
          .mergeInsert("id")
          .whenMatchedUpdateAll()
          .whenNotMatchedInsertAll()
          .execute(memoryArrow(this.schema, kept));
      }
      // Noted for a rewrite only once committed: a rewrite that began before this point notes
      // them here, and one that begins after takes its snapshot after the commit. Noted before the
      // update's commit, an update could fall between the two: not noted (no rewrite yet) and
      // not in a snapshot taken before its commit, and so lost from the copy.
      for (const r of [...inserts, ...updates]) this.changedDuringCopy?.add(r.id);
      const now = Date.now();
      await this.record([
        ...inserts.map((r) => historyRow(r, EVENT.add, "", r.text, now, actor)),
        ...updates.map((r) => historyRow(r, EVENT.update, present.get(r.id)!.text, r.text, now, actor)),
      ]);
      return out;
    });
  }

  forget(scopeWhere: string, ids: string[], actor = "api"): Promise<number> {
    if (ids.length === 0) return Promise.resolve(0);
    return this.write(async () => {
      const rows = await this.get(scopeWhere, ids);
      if (rows.length > 0) {
        await this.t.delete(`${scopeWhere} AND id IN (${rows.map((r) => sqlString(r.id)).join(", ")})`);
        this.deletes++;
        this.scopeSizes.clear();
      }
      for (const r of rows) this.changedDuringCopy?.add(r.id);
      const now = Date.now();
      await this.record(rows.map((r) => historyRow(r, EVENT.delete, r.text, "", now, actor)));
      return rows.length;
    });
  }

  /**
   * The vector search's candidates: nearest first, with cosine similarity. The path is chosen per
   * query from the scope's size and the store's plan (`"exact"` forces exact search, the ground
   * truth of the bench; `"index"` the index, once there is one, at the plan's probes):
   *
   * - No vector index yet, or a scope of at most tuning.exactScopeRows rows (2,000): exact. Each of
   *   the scope's rows is read and compared; a small scope costs little, and an index probe would
   *   meet too few of its rows to fill the pool.
   * - A larger scope that the last watch of the index found cheaper to search exactly (plan.exactUpTo):
   *   exact too.
   * - Otherwise the IVF_PQ index, with the scope as a prefilter, probing enough partitions to meet
   *   about PROBE_ROWS_FACTOR times the limit of the scope's rows (at least MIN_PROBES), times the
   *   probe scale the watch found to keep the recall (plan.probeScale), and the best
   *   limit * REFINE_FACTOR (CHECKED_REFINE_FACTOR in a scope no larger than the watch checked)
   *   re-scored on their full vectors, so distances are exact.
   *
   * Why not exact for every scope: in a table left in write order, an exact search reads each of
   * the scope's rows on its own (measured at 1M memories, one owner's 10,000: 10,000 reads, 100
   * to 150 ms), and through the index the same search took 7 ms with recall@10 0.998 against
   * exact (20 probes, refine 5). In a table rewritten in scope order the same exact search took
   * 9.5 ms: which path is cheaper depends on the table's layout, so the watch measures it. The
   * refine factor decides recall more than the probes do on a good index: for the whole tenant,
   * refine 5 gave 0.927 and refine 10 0.990, at 20 probes or 40 of 1,000, for 2 ms more (with
   * partitions of PARTITION_ROWS, 5 probes of 113: 0.990 at refine 10, 0.965 at 4, 0.940 at 2).
   * LanceDB's own answer to narrow filters, maximumNprobes(0) (probe until the limit is met), took
   * 108 ms there, so the probe count is computed here instead.
   */
  async vectorCandidates(
    scopeWhere: string,
    vector: Float32Array,
    limit: number,
    path: "auto" | "exact" | "index" = "auto",
  ): Promise<StoredCandidate[]> {
    const scopeRows = path === "exact" || !this.vectorIndex ? 0 : await this.scopeRows(scopeWhere);
    const table = this.t;
    const index = this.vectorIndex;
    const { probeScale, exactUpTo } = this.plan;
    const indexed = index !== undefined && (path === "index" || scopeRows > exactUpTo);
    const refine = scopeRows <= this.checkedUpTo ? CHECKED_REFINE_FACTOR : REFINE_FACTOR;
    const q = indexed
      ? indexedSearch(table, scopeWhere, vector, limit, index.partitions, scopeRows, probeScale, refine)
      : exactSearch(table, scopeWhere, vector);
    const rows = (await q
      .limit(limit)
      .select([...this.candidateColumns(), "_distance"])
      .toArray()) as (CandidateRow & { _distance: number })[];
    if (scopeRows > this.tuning.exactScopeRows) this.watchIndex(table, scopeWhere, scopeRows, vector, limit);
    return rows.map((r) => candidateOf(r, { vectorScore: 1 - Number(r._distance) }));
  }

  private candidateColumns(): string[] {
    return this.packed ? PACKED_CANDIDATE_COLUMNS : CANDIDATE_COLUMNS;
  }

  /** A scope's row count, remembered for SCOPE_SIZE_TTL_MS: it only picks a search path and its probes. */
  private async scopeRows(scopeWhere: string): Promise<number> {
    const known = this.scopeSizes.get(scopeWhere);
    if (known && Date.now() - known.at < SCOPE_SIZE_TTL_MS) return known.rows;
    const deletes = this.deletes;
    const rows = await this.t.countRows(scopeWhere);
    // A count that a delete overtook may be high; it is used once and not kept.
    if (deletes !== this.deletes) return rows;
    this.scopeSizes.delete(scopeWhere);
    if (this.scopeSizes.size >= SCOPE_SIZES_KEPT) this.scopeSizes.delete(this.scopeSizes.keys().next().value!);
    this.scopeSizes.set(scopeWhere, { rows, at: Date.now() });
    return rows;
  }

  /** The full-text search's candidates: BM25 over the text. */
  async textCandidates(scopeWhere: string, query: string, limit: number): Promise<StoredCandidate[]> {
    const rows = (await this.t
      .query()
      .fullTextSearch(query, { columns: ["text"] })
      .where(scopeWhere)
      .limit(limit)
      .select([...this.candidateColumns(), "_score"])
      .toArray()) as (CandidateRow & { _score: number })[];
    return rows.map((r) => candidateOf(r, { textScore: Number(r._score) }));
  }

  /**
   * Stops timers and closes the tables. A maintenance run still going (an index build can take
   * minutes) is not waited for: it will not switch tables any more, and its handles are left to
   * the process's end, because LanceDB refuses to close a table an operation is using. A copy it
   * leaves, and a replaced table not yet dropped, are dropped at the next start.
   */
  close(): void {
    this.closed = true;
    clearTimeout(this.pauseTimer);
    for (const timer of this.retireTimers) clearTimeout(timer);
    if (this.maintaining) return;
    this.table?.close();
    this.historyTable?.close();
    this.db.close();
  }
}
