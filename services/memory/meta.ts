// The memory database's tables and the pointer that says which memory table is in use (META_TABLE),
// so a rewrite or a re-embed switches readers in one commit.
import * as lancedb from "@lancedb/lancedb";
import { Field, Schema, Utf8 } from "apache-arrow";
import { DEFAULT_TUNING, SCALAR_INDEXES } from "./tuning.js";

export const TABLE = "memories_v2";
/** key -> value rows; "memories_table" names the memory table in use (TABLE when absent). */
export const META_TABLE = "troupe_meta";
export const ACTIVE_KEY = "memories_table";
/** The row count of the table when it was last rewritten in scope order (layout.ts). */
export const LAYOUT_ROWS_KEY = "layout_rows";
/** The table a rewrite replaced, dropped a little later (or at the next start if the process ends first). */
export const RETIRED_KEY = "retired_table";
/** The table a rewrite is writing; if it is not the one in use at a start, the rewrite never finished. */
export const PENDING_KEY = "layout_table";
export const metaSchema = new Schema([new Field("key", new Utf8(), false), new Field("value", new Utf8(), false)]);

/**
 * Lance's file format for every table this service makes: 2.1, where LanceDB 0.39 makes 2.2.
 * Reading a few whole rows from a large fragment is what every search ends with (the candidates'
 * columns after the vector or full-text search picks them), and 2.2 makes it several times
 * slower. Measured on bench/memory's million memories compacted into one fragment (2 cores,
 * warm page cache, the same rows copied into a table of each format, queries alternating):
 *
 * | p50 | 2.0 | 2.1 | 2.2 |
 * | --- | --- | --- | --- |
 * | exact search of an owner's 10,000 rows, 40 whole rows back | 12.4 ms | 13.3 ms | 19.4 ms |
 * | the same, ids and distances back | 9.8 ms | 10.8 ms | 10.6 ms |
 * | full-text search of the scope, 40 whole rows back | 9.5 ms | 9.3 ms | 18.5 ms |
 * | 10 whole rows by id | 7.8 ms | 6.2 ms | 28.9 ms |
 *
 * In 2.2 each fixed-width column costs a few ms to read one row from (4.5 ms against 2 ms for a
 * string column), so the cost grows with the columns asked for rather than the rows. 2.1 is as
 * fast as 2.0 and smaller on disk (2.1 against 2.3 GB there). A table keeps the format it was
 * made with through compaction; one made before this setting changes at its next rewrite
 * (layout.ts) or re-embed, both of which make a new table.
 */
export const FILE_FORMAT = "2.1";

/** The memory database at uri, making new tables in FILE_FORMAT, its metadata and index caches capped. */
export async function connectMemoryDb(
  uri: string,
  storageOptions: Record<string, string>,
  metadataCacheBytes = DEFAULT_TUNING.metadataCacheBytes,
  indexCacheBytes = DEFAULT_TUNING.indexCacheBytes,
): Promise<lancedb.Connection> {
  // connect(uri, options, session) drops its session argument (lancedb 0.39): pass it in options.
  const session = new lancedb.Session(BigInt(indexCacheBytes), BigInt(metadataCacheBytes));
  const db = await lancedb.connect(uri, {
    storageOptions: { new_table_data_storage_version: FILE_FORMAT, ...storageOptions },
    session,
  });
  sessions.set(db, session);
  return db;
}

const sessions = new WeakMap<lancedb.Connection, lancedb.Session>();
/** What LanceDB's caches of a connection made by connectMemoryDb hold, in bytes. */
export const cachedBytes = (db: lancedb.Connection): number => Number(sessions.get(db)?.sizeBytes() ?? 0);

/** The meta table's values by key (empty before anything was set). */
export async function readMeta(db: lancedb.Connection): Promise<Map<string, string>> {
  if (!(await db.tableNames()).includes(META_TABLE)) return new Map();
  const meta = await db.openTable(META_TABLE);
  const rows = (await meta.query().toArray()) as { key: string; value: string }[];
  meta.close();
  return new Map(rows.map((r) => [r.key, r.value]));
}

/** Sets values of the meta table, all in one commit. */
export async function writeMeta(db: lancedb.Connection, values: Record<string, string>): Promise<void> {
  const meta = await db.createEmptyTable(META_TABLE, metaSchema, { existOk: true });
  await meta
    .mergeInsert("key")
    .whenMatchedUpdateAll()
    .whenNotMatchedInsertAll()
    .execute(Object.entries(values).map(([key, value]) => ({ key, value })));
  meta.close();
}

/** The memory table in use: the one the pointer names, else TABLE. */
export async function activeTable(db: lancedb.Connection): Promise<string> {
  return (await readMeta(db)).get(ACTIVE_KEY) ?? TABLE;
}

/**
 * Points readers at another memory table (re-embed's switch): one commit of the meta table. The
 * table was not written in scope order, so the next maintenance past the threshold rewrites it.
 */
export async function setActiveTable(db: lancedb.Connection, name: string): Promise<void> {
  await writeMeta(db, { [ACTIVE_KEY]: name, [LAYOUT_ROWS_KEY]: "0" });
}
/**
 * The full-text index, and the scalar indexes once there are rows (LanceDB cannot train them on
 * none), for a table just made: an empty one, a re-embedded copy, a rewrite in scope order.
 */
export async function indexNewTable(table: lancedb.Table, rows: number): Promise<void> {
  await table.createIndex("text", { config: lancedb.Index.fts({ withPosition: false }), replace: true });
  if (rows > 0)
    for (const [column, config] of SCALAR_INDEXES) await table.createIndex(column, { config: config(), replace: true });
}

/** Every change to a memory: add, update, delete, with the text before and after. */
export const HISTORY_TABLE = "memory_history";
/** The first version's table; migrated into TABLE on start. */
export const LEGACY_TABLE = "memories";
