// The memory table in use and its one writer, shared by the store (reads, adds, forgets) and
// its maintenance (compaction, indexes, the rewrite that switches tables).
//
// One writer per table: every change goes through a promise chain, so this process never races
// itself; a commit conflict with another process is retried a few times with backoff.
import type * as lancedb from "@lancedb/lancedb";
import type { Schema } from "apache-arrow";
import { arrowTable } from "./columns.js";
import { type HistoryRow, hasPayload, historySchema, schemaFor } from "./memory-schema.js";
import { partitionsFor, retryConflicts } from "./search-plan.js";
import { HISTORY_TABLE, TABLE } from "./meta.js";
import { WRITES_PAUSE_MS } from "./tuning.js";

export class MemoryTable {
  /** The table in use (set by the store's open, switched by a rewrite). */
  table!: lancedb.Table;
  /**
   * Its name, kept here: LanceDB's name getter throws ("cannot be borrowed mutably while another
   * borrow is active") while an operation is using the table.
   */
  name = TABLE;
  /** Every change of every memory (add, update, delete), append-only. */
  history!: lancedb.Table;
  /** The schema of the table in use (schemaFor, packed unless the table predates payloads). */
  schema: Schema;
  /** The vector index, once built (known at open and after maintenance; searches read it). */
  vectorIndex?: { partitions: number };
  /** The table's row count at its last rewrite in scope order. */
  layoutRows = 0;
  /** Rows at the last count plus those added since (deletes aside): enough to know the index is due. */
  approxRows = 0;
  /** While a rewrite copies the table: the ids written since the copy's snapshot, to carry over. */
  changedDuringCopy?: Set<string>;
  closed = false;
  /** When the last write ended. */
  lastWrite = 0;
  private writes: Promise<unknown> = Promise.resolve();
  /** Writes asked for and not finished: while one waits, writes have not paused. */
  private pendingWrites = 0;

  /** @param written called after each successful write (maintenance counts them). Contract: never throws. */
  constructor(
    /** The connection the tables were opened from (switched by reopen). */
    public db: lancedb.Connection,
    readonly dim: number,
    private readonly written: () => void,
  ) {
    this.schema = schemaFor(dim);
  }

  /**
   * Switches to `db`, a new connection to the same database, opening the table in use and the
   * history from it, if `wanted()` still holds once they are open. Returns the handles it
   * replaced (none if it did not switch), for the caller to close once operations begun on them
   * are done. Call through betweenWrites, so no write is between the two.
   */
  async reopen(db: lancedb.Connection, wanted: () => boolean): Promise<{ close(): void }[]> {
    let table: lancedb.Table | undefined;
    let history: lancedb.Table;
    try {
      table = await db.openTable(this.name);
      history = await db.openTable(HISTORY_TABLE);
    } catch (err) {
      table?.close();
      db.close();
      throw err;
    }
    if (!wanted()) {
      for (const h of [table, history, db]) h.close();
      return [];
    }
    const replaced = [this.table, this.history, this.db];
    this.db = db;
    this.table = table;
    this.history = history;
    return replaced;
  }

  /** Appends changes to the history (append-only; nothing is written for none). */
  async recordHistory(changes: HistoryRow[]): Promise<void> {
    if (changes.length > 0) await this.history.add(arrowTable(historySchema, changes));
  }

  /** Whether the table in use has payloads (schemaFor). */
  get packed(): boolean {
    return hasPayload(this.schema);
  }

  /**
   * No write for WRITES_PAUSE_MS and none waiting. A write waiting in the queue means the writes
   * have not paused, however long ago the last one ended (a maintenance step holding the queue,
   * such as a scalar index build, must not look like a pause).
   */
  get paused(): boolean {
    return this.pendingWrites === 0 && Date.now() - this.lastWrite >= WRITES_PAUSE_MS;
  }

  /** Runs a change after every earlier one, retrying commit conflicts with other writers. */
  write<T>(fn: () => Promise<T>): Promise<T> {
    this.pendingWrites++;
    return this.inQueue(async () => {
      try {
        const out = await retryConflicts(fn, 5);
        this.lastWrite = Date.now();
        this.written();
        return out;
      } finally {
        this.pendingWrites--;
      }
    });
  }

  /** Runs `fn` in the writer's queue, between two writes, without counting as one (reopen). */
  betweenWrites<T>(fn: () => Promise<T>): Promise<T> {
    return this.inQueue(fn);
  }

  private inQueue<T>(run: () => Promise<T>): Promise<T> {
    const next = this.writes.then(run, run);
    this.writes = next.catch(() => undefined);
    return next;
  }

  /** The vector index's statistics, if it exists. */
  async vectorIndexStats(): Promise<lancedb.IndexStatistics | undefined> {
    const idx = (await this.table.listIndices()).find((i) => i.columns.includes("vector"));
    return idx && (await this.table.indexStats(idx.name));
  }

  /** Reads whether the vector index exists, and its partition count for the probe arithmetic. */
  async loadVectorIndex(): Promise<void> {
    const stats = await this.vectorIndexStats();
    // LanceDB does not report the partition count; the build's own rule, applied to the rows
    // indexed now, gives it, or a few more once optimize() has joined small partitions: more
    // probes, never fewer.
    this.vectorIndex = stats ? { partitions: partitionsFor(stats.numIndexedRows) } : undefined;
  }
}
