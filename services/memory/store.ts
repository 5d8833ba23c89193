// The memory store: opens the table (migrating and cleaning up what earlier processes left),
// adds, updates and forgets memories through the table's one writer, and runs the two candidate
// searches (vector and full text) that ranking.ts turns into results. Beside it: memory-table.ts
// (the table in use and its writer), add-commit.ts (one group of adds, checked and committed),
// maintenance.ts (compaction, indexes, the rewrite in scope
// order, layout.ts), index-watch.ts (how the vector index serves), search-plan.ts (how a search
// runs), memory-schema.ts (rows, payloads, filters).
//
// - A group of adds is at most three LanceDB commits (new rows, updates, their history), each
//   landing whole or not at all. A crash between two of them keeps the earlier ones: a batch that
//   both adds and updates can be stored in part, its history short. Its caller had no answer yet,
//   and sending the batch again completes it (stored texts come back DUPLICATE, updates apply).
// - Equal texts in one scope are stored once (content_hash of the normalised text).
// - Every stored vector carries the embedder that made it; a table made by another embedder is
//   refused rather than searched with vectors from two spaces. `troupe memory reembed`
//   (reembed.ts) migrates: it writes a new table and switches the pointer in META_TABLE to it in
//   one commit, so a reader sees the old table or the new one, never a mix.
import type * as lancedb from "@lancedb/lancedb";
import { failedPrecondition } from "../shared/errors.js";
import type { Logger } from "../shared/process/log.js";
import type { AddOutcome, AddRequest } from "./add-plan.js";
import { AddCommit } from "./add-commit.js";
import { GroupCommit } from "./group-commit.js";
import { IndexWatcher } from "./index-watch.js";
import { MemoryTable } from "./memory-table.js";
import { Maintenance } from "./maintenance.js";
import {
  type StoreTuning,
  DEFAULT_TUNING,
  REFINE_FACTOR,
  CHECKED_REFINE_FACTOR,
  SCOPE_SIZE_TTL_MS,
  SCOPE_SIZES_KEPT,
} from "./tuning.js";
import {
  TABLE,
  ACTIVE_KEY,
  LAYOUT_ROWS_KEY,
  RETIRED_KEY,
  PENDING_KEY,
  connectMemoryDb,
  readMeta,
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
  type StoredMemory,
  MEMORY_COLUMNS,
  CANDIDATE_COLUMNS,
  PACKED_CANDIDATE_COLUMNS,
  type StoredCandidate,
} from "./memory-schema.js";
import { type IndexServing, indexedSearch, exactSearch, type CandidateRow, candidateOf } from "./search-plan.js";

export class MemoryStore {
  /** The table in use, its schema and its one writer (memory-table.ts). */
  private readonly mt: MemoryTable;
  /** Compaction, indexes and the rewrite in scope order (maintenance.ts). */
  private readonly maintenance: Maintenance;
  /** The watch of the vector index's first searches, and the plan it decided (index-watch.ts). */
  private readonly watcher: IndexWatcher;
  /** Scope row counts, remembered for SCOPE_SIZE_TTL_MS (scopeRows). */
  private readonly scopeSizes = new Map<string, { rows: number; at: number }>();
  /** Deletes so far: a scope count begun before a delete is not kept (scopeRows). */
  private deletes = 0;
  /** Adds waiting for the writer, committed together (group-commit.ts). */
  private readonly adds: GroupCommit<AddRequest, AddOutcome[]>;

  private constructor(
    db: lancedb.Connection,
    connect: () => Promise<lancedb.Connection>,
    readonly embedder: string,
    readonly dim: number,
    private readonly logger: Logger,
    private readonly tuning: StoreTuning,
  ) {
    this.mt = new MemoryTable(db, dim, () => this.maintenance.afterWrite());
    this.watcher = new IndexWatcher(tuning, logger, () => this.mt.closed);
    this.maintenance = new Maintenance(this.mt, this.watcher, tuning, logger, connect);
    const commit = new AddCommit(this.mt);
    this.adds = new GroupCommit(
      (group) => commit.commit(group),
      (turn) => this.mt.write(turn),
      tuning.maxAddGroup,
    );
  }

  static async open(
    uri: string,
    storageOptions: Record<string, string>,
    embedder: string,
    dim: number,
    logger: Logger,
    tuning: Partial<StoreTuning> = {},
  ): Promise<MemoryStore> {
    const tuned = { ...DEFAULT_TUNING, ...tuning };
    const connect = () => connectMemoryDb(uri, storageOptions, tuned.metadataCacheBytes, tuned.indexCacheBytes);
    const store = new MemoryStore(await connect(), connect, embedder, dim, logger, tuned);
    await store.init();
    return store;
  }

  private async init(): Promise<void> {
    const names = await this.mt.db.tableNames();
    const meta = await readMeta(this.mt.db);
    const active = meta.get(ACTIVE_KEY) ?? TABLE;
    this.mt.name = active;
    if (names.includes(active)) {
      this.mt.table = await this.mt.db.openTable(active);
      await this.checkEmbedder();
      if (!hasPayload(await this.mt.table.schema())) {
        // Written as it is until the next rewrite, which makes the table anew with payloads.
        this.mt.schema = schemaFor(this.dim, false);
        this.logger.info(
          `the memory table ${active} has no payload column (made before it existed): searches read its columns until its next rewrite`,
        );
      }
    } else {
      const t = await this.mt.db.createEmptyTable(active, this.mt.schema, { existOk: true });
      await indexNewTable(t, 0);
      this.mt.table = t;
    }
    this.mt.history = names.includes(HISTORY_TABLE)
      ? await this.mt.db.openTable(HISTORY_TABLE)
      : await this.mt.db.createEmptyTable(HISTORY_TABLE, historySchema, { existOk: true });
    if (names.includes(LEGACY_TABLE)) await this.migrateLegacy();
    // A rewrite's table not in use was left by a run that stopped before its switch; the table a
    // rewrite replaced may outlive a process that ended before dropping it.
    const leftovers = [meta.get(RETIRED_KEY), meta.get(PENDING_KEY)];
    for (const n of names) {
      if (n !== active && leftovers.includes(n)) {
        this.logger.info(`dropping ${n}: a memory table no longer in use (scope-order rewrite)`);
        await this.mt.db.dropTable(n);
      }
    }
    this.mt.layoutRows = Number(meta.get(LAYOUT_ROWS_KEY) ?? 0);
    await this.mt.loadVectorIndex();
    // How an index an earlier process built serves is not known here (the plan is not stored):
    // its first searches decide again.
    if (this.mt.vectorIndex) this.watcher.restart("the store opened");
    this.mt.approxRows = await this.mt.table.countRows();
  }

  /** The changes of a scope (or one memory), oldest first. */
  async history(scopeWhere: string, memoryId = ""): Promise<HistoryRow[]> {
    const where = memoryId ? `${scopeWhere} AND memory_id = ${sqlString(memoryId)}` : scopeWhere;
    const rows = (await this.mt.history.query().where(where).toArray()) as HistoryRow[];
    // Timestamp columns come back as Dates or numbers; Number() makes either milliseconds.
    return rows.map((r) => ({ ...r, time: Number(r.time) })).sort((a, b) => a.time - b.time);
  }

  /**
   * The memories of a scope with these ids: every column but the vector and the embedder, which
   * no reader of a whole memory needs (LanceDB reads each column named on its own; at 1M memories
   * each costs a few ms for rows spread over the table).
   */
  async get(scopeWhere: string, ids: string[]): Promise<StoredMemory[]> {
    if (ids.length === 0) return [];
    return (await this.mt.table
      .query()
      .where(`${scopeWhere} AND id IN (${ids.map(sqlString).join(", ")})`)
      .select(MEMORY_COLUMNS)
      .toArray()) as StoredMemory[];
  }

  /** The ids of the scope's memories made in session `sessionId`. */
  async idsMadeIn(scopeWhere: string, sessionId: string): Promise<string[]> {
    const rows = await this.mt.table
      .query()
      .where(`${scopeWhere} AND session_id = ${sqlString(sessionId)}`)
      .select(["id"])
      .toArray();
    return rows.map((r) => String((r as { id: string }).id));
  }

  /** The first version's rows, carried over with defaults for the new columns, then the old table dropped. */
  private async migrateLegacy(): Promise<void> {
    const old = await this.mt.db.openTable(LEGACY_TABLE);
    const rows = (await old.query().toArray()) as (Pick<
      MemoryRow,
      "id" | "tenant" | "owner" | "agent_id" | "session_id" | "kind" | "text" | "embedder"
    > & { vector: Float32Array; created: number | Date })[];
    if (rows.length > 0) {
      if (rows.some((r) => r.embedder !== this.embedder))
        throw new Error(`the memory table ${LEGACY_TABLE} was embedded by ${rows[0].embedder}, not ${this.embedder}`);
      await this.mt.table.add(
        memoryArrow(
          this.mt.schema,
          rows.map((r) =>
            newMemoryRow({ ...r, created: Number(r.created), updated: Number(r.created), provenance: "migrated" }),
          ),
        ),
      );
    }
    await this.mt.db.dropTable(LEGACY_TABLE);
    this.logger.info(`migrated ${rows.length} memories from ${LEGACY_TABLE} to ${TABLE}`);
  }

  private async checkEmbedder(): Promise<void> {
    const sample = (await this.mt.table.query().select(["embedder"]).limit(1).toArray()) as { embedder: string }[];
    if (sample.length > 0 && sample[0].embedder !== this.embedder) {
      throw failedPrecondition(
        `the memory table was embedded by ${sample[0].embedder} and this service embeds with ${this.embedder}: vectors of two embedders cannot be compared; re-embed the table (troupe memory reembed, with this service's embedder settings) or configure ${sample[0].embedder}`,
      );
    }
  }

  /** maintain() for a timer: nobody awaits it, so a failure is logged. */
  maintainInBackground(mode: "now" | "when idle"): void {
    this.maintenance.inBackground(mode);
  }

  /** Runs maintenance (maintenance.ts) now, or joins the run going; "when idle" may skip the large-table work. */
  maintain(options: { vectorIndex: "now" | "when idle" } = { vectorIndex: "now" }): Promise<void> {
    return this.maintenance.run(options);
  }

  /** How the vector index in use serves, and the plan its watch decided (IndexWatcher.serving). */
  indexServing(): Promise<IndexServing | null> {
    return this.watcher.serving();
  }

  async vectorIndexed(): Promise<{ indexed: boolean; unindexed: number }> {
    const stats = await this.mt.vectorIndexStats();
    return { indexed: stats !== undefined, unindexed: stats?.numUnindexedRows ?? 0 };
  }

  /** Times the database was opened anew (maintenance.ts reconnect). */
  get reconnects(): number {
    return this.maintenance.reconnects;
  }

  /** The table's size and version, its vector index, and how often the database was opened anew. */
  async stats(): Promise<{ rows: number; version: number; indexed: boolean; unindexed: number; reconnects: number }> {
    const [rows, version, idx] = await Promise.all([
      this.mt.table.countRows(),
      this.mt.table.version(),
      this.vectorIndexed(),
    ]);
    return { rows, version, ...idx, reconnects: this.maintenance.reconnects };
  }

  /**
   * How the table and its vector index stand, for an operator or a bench reading a figure: rows
   * at the last rewrite in scope order (the rows past them lie in write order), and the index's
   * rows and parts (optimize() adds rows as further parts until the next rewrite).
   */
  async layout(): Promise<{ rows: number; layoutRows: number; indexedRows: number; indexParts: number }> {
    const [rows, idx] = await Promise.all([this.mt.table.countRows(), this.mt.vectorIndexStats()]);
    return {
      rows,
      layoutRows: this.mt.layoutRows,
      indexedRows: idx?.numIndexedRows ?? 0,
      indexParts: idx?.numIndices ?? 0,
    };
  }

  /**
   * Stores a batch. Rows whose text is already stored in the scope are skipped as duplicates.
   * Returns, per row, the id it has and what happened. Adds that arrive while another is being
   * committed go together in the next commit (group-commit.ts): one commit of the table for their
   * new rows, one for their updates, one of the history.
   */
  add(scopeWhere: string, rows: MemoryRow[], upsertIds: Set<string>, actor = "api"): Promise<AddOutcome[]> {
    return this.adds.submit({ scopeWhere, rows, upsertIds, actor });
  }

  forget(scopeWhere: string, ids: string[], actor = "api"): Promise<number> {
    if (ids.length === 0) return Promise.resolve(0);
    return this.mt.write(async () => {
      const rows = await this.get(scopeWhere, ids);
      if (rows.length > 0) {
        await this.mt.table.delete(`${scopeWhere} AND id IN (${rows.map((r) => sqlString(r.id)).join(", ")})`);
        this.deletes++;
        this.scopeSizes.clear();
      }
      for (const r of rows) this.mt.changedDuringCopy?.add(r.id);
      const now = Date.now();
      await this.mt.recordHistory(rows.map((r) => historyRow(r, EVENT.delete, r.text, "", now, actor)));
      return rows.length;
    });
  }

  /**
   * The vector search's candidates: nearest first, with cosine similarity. Exact while there is no
   * vector index, for scopes of at most tuning.exactScopeRows, and for scopes the plan found
   * cheaper to search exactly; otherwise the index, with the plan's probes and re-scoring on full
   * vectors (docs/memory.md, "Search", says why and with what figures). `path` forces one way
   * (`"exact"` is the bench's ground truth).
   */
  async vectorCandidates(
    scopeWhere: string,
    vector: Float32Array,
    limit: number,
    path: "auto" | "exact" | "index" = "auto",
  ): Promise<StoredCandidate[]> {
    const scopeRows = path === "exact" || !this.mt.vectorIndex ? 0 : await this.scopeRows(scopeWhere);
    const table = this.mt.table;
    const index = this.mt.vectorIndex;
    const { probeScale, exactUpTo } = this.watcher.plan;
    const indexed = index !== undefined && (path === "index" || scopeRows > exactUpTo);
    const refine = scopeRows <= this.watcher.checkedUpTo ? CHECKED_REFINE_FACTOR : REFINE_FACTOR;
    const q = indexed
      ? indexedSearch(table, scopeWhere, vector, limit, index.partitions, scopeRows, probeScale, refine)
      : exactSearch(table, scopeWhere, vector);
    const rows = (await q
      .limit(limit)
      .select([...this.candidateColumns(), "_distance"])
      .toArray()) as (CandidateRow & { _distance: number })[];
    if (index && scopeRows > this.tuning.exactScopeRows)
      this.watcher.offer(table, index.partitions, scopeWhere, scopeRows, vector, limit);
    return rows.map((r) => candidateOf(r, { vectorScore: 1 - Number(r._distance) }));
  }

  private candidateColumns(): string[] {
    return this.mt.packed ? PACKED_CANDIDATE_COLUMNS : CANDIDATE_COLUMNS;
  }

  /** A scope's row count, remembered for SCOPE_SIZE_TTL_MS: it only picks a search path and its probes. */
  private async scopeRows(scopeWhere: string): Promise<number> {
    const known = this.scopeSizes.get(scopeWhere);
    if (known && Date.now() - known.at < SCOPE_SIZE_TTL_MS) return known.rows;
    const deletes = this.deletes;
    const rows = await this.mt.table.countRows(scopeWhere);
    // A count that a delete overtook may be high; it is used once and not kept.
    if (deletes !== this.deletes) return rows;
    this.scopeSizes.delete(scopeWhere);
    if (this.scopeSizes.size >= SCOPE_SIZES_KEPT) this.scopeSizes.delete(this.scopeSizes.keys().next().value!);
    this.scopeSizes.set(scopeWhere, { rows, at: Date.now() });
    return rows;
  }

  /** The full-text search's candidates: BM25 over the text. */
  async textCandidates(scopeWhere: string, query: string, limit: number): Promise<StoredCandidate[]> {
    const rows = (await this.mt.table
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
    this.mt.closed = true;
    this.maintenance.stop();
    if (this.maintenance.running) return;
    this.mt.table?.close();
    this.mt.history?.close();
    this.mt.db.close();
  }
}
