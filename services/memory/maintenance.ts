// Maintenance of the memory table, outside the writer's queue where it can be: compaction and
// index catch-up, the scalar indexes, and once the table is large the vector index and the
// rewrite in scope order (layout.ts), which switches the table in use. Every so many commits
// the database is opened anew (reconnect). docs/memory.md, "Writes", has the schedule and the
// figures behind it.
import type * as lancedb from "@lancedb/lancedb";
import type { Logger } from "../shared/process/log.js";
import { buildVectorIndex, type IndexWatcher } from "./index-watch.js";
import { carryOver, copyInScopeOrder, layoutTableName } from "./layout.js";
import { memoryArrow, schemaFor } from "./memory-schema.js";
import type { MemoryTable } from "./memory-table.js";
import { ACTIVE_KEY, LAYOUT_ROWS_KEY, PENDING_KEY, RETIRED_KEY, indexNewTable, writeMeta } from "./meta.js";
import { isConflict, retryConflicts } from "./search-plan.js";
import {
  LAYOUT_GROWTH,
  MAINTAIN_INTERVAL_MS,
  OPTIMIZE_EVERY,
  RELAYOUT_RETRY_MS,
  RETIRE_AFTER_MS,
  SCALAR_INDEXES,
  type StoreTuning,
  WRITES_PAUSE_MS,
} from "./tuning.js";

export class Maintenance {
  private sinceOptimize = 0;
  private lastMaintained = 0;
  private pauseTimer?: NodeJS.Timeout;
  private maintaining?: { mode: "now" | "when idle"; done: Promise<void> };
  private readonly retireTimers = new Set<NodeJS.Timeout>();
  /** When a rewrite last failed: it costs minutes of both cores, so it is not retried at once. */
  private relayoutFailedAt = 0;
  private sinceReconnect = 0;
  private lastReconnectMs = -Infinity;
  private reconnecting = false;
  /** Times the database was opened anew (reconnect). */
  reconnects = 0;

  /** @param connect opens a new connection to the memory database (meta.ts connectMemoryDb). */
  constructor(
    private readonly mt: MemoryTable,
    private readonly watcher: IndexWatcher,
    private readonly tuning: StoreTuning,
    private readonly logger: Logger,
    private readonly connect: () => Promise<lancedb.Connection>,
  ) {}

  /** Whether a run is going (the store's close then leaves the tables' handles open). */
  get running(): boolean {
    return this.maintaining !== undefined;
  }

  /** Stops the timers (the store is closing). */
  stop(): void {
    clearTimeout(this.pauseTimer);
    for (const timer of this.retireTimers) clearTimeout(timer);
  }

  /**
   * Counts a write: maintenance runs after OPTIMIZE_EVERY of them (at most every
   * MAINTAIN_INTERVAL_MS), and the database is opened anew after tuning.reconnectCommits (at
   * most every tuning.reconnectMinMs).
   */
  afterWrite(): void {
    if (
      this.tuning.reconnectCommits > 0 &&
      ++this.sinceReconnect >= this.tuning.reconnectCommits &&
      Date.now() - this.lastReconnectMs >= this.tuning.reconnectMinMs
    ) {
      this.sinceReconnect = 0;
      this.lastReconnectMs = Date.now();
      void this.reconnect().catch((err: unknown) =>
        this.logger.warn("could not open the memory database anew; the current connection stays", {
          error: String((err as Error)?.message ?? err),
        }),
      );
    }
    if (!this.mt.vectorIndex && this.mt.approxRows >= this.tuning.indexThreshold) {
      // Once the writes pause, a maintenance run builds the vector index if the table is due one.
      clearTimeout(this.pauseTimer);
      this.pauseTimer = setTimeout(() => this.inBackground("when idle"), WRITES_PAUSE_MS + 500);
      this.pauseTimer.unref();
    }
    if (++this.sinceOptimize < OPTIMIZE_EVERY || Date.now() - this.lastMaintained < MAINTAIN_INTERVAL_MS) return;
    this.sinceOptimize = 0;
    this.lastMaintained = Date.now();
    // The vector index waits for a pause in writes: built in the middle of a bulk load, it takes
    // the cores the load needs (the next maintenance after the load builds it).
    this.inBackground("when idle");
  }

  /** maintain() for a timer or a write: nobody awaits it, so a failure is logged. */
  inBackground(mode: "now" | "when idle"): void {
    void this.run({ vectorIndex: mode }).catch((err: unknown) =>
      this.logger.warn("memory maintenance failed", { error: String((err as Error)?.message ?? err) }),
    );
  }

  /**
   * Compaction and index catch-up; the scalar indexes; the vector index and the rewrite in scope
   * order once the table is large enough. One run at a time (index builds that overlap
   * conflict). A call while one runs joins it, unless it asks for the large-table work "now" and
   * the running one may skip it: then a run follows the current one.
   */
  run(options: { vectorIndex: "now" | "when idle" } = { vectorIndex: "now" }): Promise<void> {
    const mode = options.vectorIndex;
    if (this.maintaining && (mode === "when idle" || this.maintaining.mode === "now")) return this.maintaining.done;
    const before = this.maintaining?.done.catch(() => undefined) ?? Promise.resolve();
    const done: Promise<void> = before
      .then(() => this.runOnce(mode))
      .finally(() => {
        if (this.maintaining?.done === done) this.maintaining = undefined;
      });
    this.maintaining = { mode, done };
    return done;
  }

  private async runOnce(vectorIndex: "now" | "when idle"): Promise<void> {
    if (this.mt.closed) return;
    // Outside the writer's queue: at a million rows a compaction takes seconds, and holding every
    // add for them is what a caller would feel. Adds commit beside a compaction (appends and a
    // rewrite of older fragments do not conflict). An update or delete that commits first makes
    // the compaction's commit fail as a conflict; it is tried again, and after a few lost races
    // left to the next maintenance while the rest of this one goes on.
    const cleanupOlderThan = new Date(Date.now() - 3600_000);
    let compacted = false;
    try {
      compacted =
        (await retryConflicts(() => this.mt.table.optimize({ cleanupOlderThan }), 3)).compaction.fragmentsRemoved > 0;
    } catch (err) {
      if (!isConflict(err)) throw err;
      this.logger.warn("memory compaction lost 3 races with updates; it runs again at the next maintenance");
    }
    // The history only grows; unmaintained, each add commits a manifest listing every earlier one
    // (at 1M memories an add of 1,000 history rows took twice what it took at the start).
    await this.mt.history.optimize({ cleanupOlderThan });
    const rows = await this.mt.table.countRows();
    this.mt.approxRows = rows;
    const indices = await this.mt.table.listIndices();
    // Scalar indexes make the scope predicate (applied before every search) and the dedupe and
    // upsert lookups cheap instead of a scan of every row.
    for (const [column, config] of SCALAR_INDEXES) {
      if (rows > 0 && !indices.some((i) => i.columns.includes(column))) {
        await this.mt.write(() => this.mt.table.createIndex(column, { config: config(), replace: true }));
      }
    }
    // The rewrite in scope order and the vector index wait for a pause in writes (or a
    // maintenance that asks for them now): each takes the cores for minutes at a million rows.
    // Both run outside the writer's queue, so adds go on meanwhile.
    //
    // A write waiting in the queue means the writes have not paused, even if the last one ended
    // long ago: a step of this maintenance in the writer's queue (a scalar index build) holds the
    // writes back, and must not be taken for a pause that starts a rewrite in the middle of a load.
    const now = vectorIndex === "now" || this.mt.paused;
    // A table without payloads is rewritten at the first chance: the rewrite makes them.
    const grown = rows >= this.mt.layoutRows * (1 + LAYOUT_GROWTH) || !this.mt.packed;
    const rewriteDue =
      rows >= this.tuning.indexThreshold && grown && Date.now() - this.relayoutFailedAt >= RELAYOUT_RETRY_MS;
    const why = vectorIndex === "now" ? "asked for now" : "writes paused";
    if (now && rewriteDue) {
      this.logger.info(
        `rewriting the memory table in scope order: ${rows} memories, ${this.mt.layoutRows} at the last rewrite (${why})`,
      );
      await this.relayout();
    } else if (now && rows >= this.tuning.indexThreshold && !indices.some((i) => i.columns.includes("vector"))) {
      this.logger.info(`building the vector index: ${rows} memories (${why})`);
      await buildVectorIndex(this.mt.table, this.mt.dim, this.logger);
      this.watcher.restart("a new index");
    } else if (compacted && this.mt.vectorIndex) {
      // A compaction rewrites fragments under the index, and that has spoiled it (index-watch.ts);
      // so also for an index an earlier process built.
      this.watcher.restart("a compaction");
    }
    await this.mt.loadVectorIndex();
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
    const oldName = this.mt.name;
    const name = layoutTableName();
    this.mt.changedDuringCopy = new Set();
    let copy: lancedb.Table | undefined;
    try {
      await writeMeta(this.mt.db, { [PENDING_KEY]: name });
      const t0 = Date.now();
      const snapshot = await this.mt.db.openTable(oldName);
      await snapshot.checkout(await snapshot.version());
      const { table, rows } = await copyInScopeOrder(this.mt.db, snapshot, name, schemaFor(this.mt.dim), memoryArrow);
      snapshot.close();
      copy = table;
      // The next maintenance would merge the copy's fragments anyway, and a compaction under a
      // vector index rewrites the index to follow the rows it moved: compact first, then index.
      await copy.optimize({ cleanupOlderThan: new Date() });
      await indexNewTable(copy, rows);
      if (rows >= this.tuning.indexThreshold) await buildVectorIndex(copy, this.mt.dim, this.logger);
      const switched = copy;
      await this.mt.write(async () => {
        if (this.mt.closed)
          throw new Error("the store was closed during the rewrite; the copy is dropped at the next start");
        this.mt.schema = schemaFor(this.mt.dim);
        await carryOver(this.mt.table, [...this.mt.changedDuringCopy!], switched, this.mt.schema);
        const count = await switched.countRows();
        await writeMeta(this.mt.db, { [ACTIVE_KEY]: name, [LAYOUT_ROWS_KEY]: String(count), [RETIRED_KEY]: oldName });
        const old = this.mt.table;
        this.mt.table = switched;
        this.mt.name = name;
        this.mt.layoutRows = count;
        this.mt.changedDuringCopy = undefined;
        // The copy is compacted and indexed: no maintenance is due because of this write (a run
        // started now would compete with searches for the cores, for nothing).
        await this.mt.loadVectorIndex();
        if (rows >= this.tuning.indexThreshold) this.watcher.restart("a new index");
        clearTimeout(this.pauseTimer);
        this.sinceOptimize = 0;
        this.lastMaintained = Date.now();
        this.retire(old, oldName);
      });
      this.logger.info(`rewrote the memory table in scope order (${rows} memories) in ${Date.now() - t0} ms`);
    } catch (err) {
      this.mt.changedDuringCopy = undefined;
      this.relayoutFailedAt = Date.now();
      if (copy && this.mt.table !== copy) {
        copy.close();
        await this.mt.db.dropTable(name).catch(() => undefined);
      }
      throw err;
    }
  }

  /**
   * Opens the database anew and switches to it, in the writer's queue, then closes the old
   * handles once what began on them is done. Why: LanceDB keeps native memory per commit that no
   * cache cap reaches, and it goes with the connection (lance-format/lance#1983; docs/memory.md,
   * "Writes", has the figures). Not while a maintenance run goes: a rewrite holds tables of the
   * connection it began on until its switch.
   */
  async reconnect(): Promise<void> {
    if (this.reconnecting || this.maintaining || this.mt.closed) return;
    this.reconnecting = true;
    try {
      const db = await this.connect();
      // Checked again once the new handles are open: a run may have begun meanwhile (a timer's).
      const replaced = await this.mt.betweenWrites(() =>
        this.mt.reopen(db, () => !this.maintaining && !this.mt.closed),
      );
      if (replaced.length > 0) {
        this.reconnects++;
        this.closeLater(replaced);
      }
    } finally {
      this.reconnecting = false;
    }
  }

  /**
   * Closes replaced handles (then runs `after`, if given) once searches that began on them have
   * had time to finish, and after any maintenance run going then (it may have begun on them).
   */
  private closeLater(handles: { close(): void }[], after?: () => void): void {
    const timer = setTimeout(async () => {
      this.retireTimers.delete(timer);
      await this.maintaining?.done.catch(() => undefined);
      for (const h of handles) {
        try {
          h.close();
        } catch (err) {
          // LanceDB refuses to close a handle an operation still uses: the process's end frees it.
          this.logger.warn("could not close a replaced memory database handle", { error: String(err) });
        }
      }
      after?.();
    }, RETIRE_AFTER_MS);
    timer.unref();
    this.retireTimers.add(timer);
  }

  /** Closes and drops a table a rewrite replaced, as closeLater does. */
  private retire(table: lancedb.Table, name: string): void {
    this.closeLater(
      [table],
      () =>
        void this.mt.db
          .dropTable(name)
          .catch((err: unknown) =>
            this.logger.warn(`could not drop the replaced memory table ${name}`, { error: String(err) }),
          ),
    );
  }
}
