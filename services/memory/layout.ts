// The memory table rewritten in scope order (tenant, owner, then age), in large batches.
//
// Why: memories arrive a few at a time from many owners, so one owner's rows end up spread over
// the whole table, in the many small fragments that small writes make. LanceDB's compaction
// merges those fragments but keeps their order, and the files it writes are slow to read a row
// at a time. Measured at 1M memories (2 cores, warm page cache):
//
// - the whole rows of 10 search winners: 40 to 50 ms from the compacted table, 10 ms after this
//   rewrite (13 ms in write order but in large batches);
// - one owner's full-text search: 10 to 15 ms compacted, 5 ms rewritten.
//
// The store runs this in maintenance (store.ts relayout()) once enough rows were written since
// the last rewrite, with searches and writes going on against the old table meanwhile; this
// module only makes the copy.
import type * as lancedb from "@lancedb/lancedb";
import type { Schema, Table as ArrowTable } from "apache-arrow";
import { type MemoryRow, memoryArrow, sqlString } from "./memory-schema.js";

/** Tables this rewrite makes are named memories_l<base-36 time>. */
export const layoutTableName = (): string => `memories_l${Date.now().toString(36)}`;

/** Rows per add: each add is one fragment, written as one batch. */
const CHUNK_ROWS = 50_000;

interface Key {
  scope: string;
  created: number;
  rowId: bigint;
}

/**
 * Copies every row of `from` (a table checked out at a fixed version, so row ids stay valid)
 * into a new empty table of `schema` in scope order, each chunk made Arrow by `toArrow`. Returns
 * the new table and the rows copied.
 */
export async function copyInScopeOrder(
  db: lancedb.Connection,
  from: lancedb.Table,
  name: string,
  schema: Schema,
  toArrow: (schema: Schema, rows: readonly object[]) => ArrowTable,
): Promise<{ table: lancedb.Table; rows: number }> {
  const keys: Key[] = [];
  for await (const batch of from.query().select(["tenant", "owner", "created"]).withRowId()) {
    const tenant = batch.getChild("tenant")!;
    const owner = batch.getChild("owner")!;
    const created = batch.getChild("created")!;
    const rowId = batch.getChild("_rowid")!;
    for (let i = 0; i < batch.numRows; i++) {
      // NUL cannot occur in a scope value (NAME in auth.ts), so it separates tenant from owner.
      keys.push({
        scope: `${String(tenant.get(i))}\u0000${String(owner.get(i))}`,
        created: Number(created.get(i)),
        rowId: rowId.get(i) as bigint,
      });
    }
  }
  keys.sort((a, b) =>
    a.scope < b.scope ? -1 : a.scope > b.scope ? 1 : a.created - b.created || Number(a.rowId - b.rowId),
  );

  const table = await db.createEmptyTable(name, schema);
  for (let start = 0; start < keys.length; start += CHUNK_ROWS) {
    const part = keys.slice(start, start + CHUNK_ROWS);
    // A take returns rows in storage order; the row ids put them back in scope order.
    const taken = (await from
      .takeRowIds(part.map((k) => k.rowId))
      .withRowId()
      .toArray()) as (Record<string, unknown> & { _rowid: bigint })[];
    const byRowId = new Map(taken.map((r) => [r._rowid, r]));
    const ordered = part.map((k) => {
      const row = byRowId.get(k.rowId);
      if (!row) throw new Error(`row ${k.rowId} of the snapshot could not be read back`);
      return row;
    });
    await table.add(toArrow(schema, ordered));
  }
  return { table, rows: keys.length };
}

/**
 * Makes `copy` hold what `live` holds now for these ids (rows written while the copy was made):
 * those that exist are upserted, the others deleted from the copy. Runs in the writer's queue.
 */
export async function carryOver(
  live: lancedb.Table,
  ids: string[],
  copy: lancedb.Table,
  schema: Schema,
): Promise<void> {
  for (let start = 0; start < ids.length; start += 1000) {
    const part = ids.slice(start, start + 1000);
    const rows = (await live
      .query()
      .where(`id IN (${part.map(sqlString).join(", ")})`)
      .toArray()) as MemoryRow[];
    if (rows.length > 0)
      await copy.mergeInsert("id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute(memoryArrow(schema, rows));
    const kept = new Set(rows.map((r) => r.id));
    const gone = part.filter((id) => !kept.has(id));
    if (gone.length > 0) await copy.delete(`id IN (${gone.map(sqlString).join(", ")})`);
  }
}
