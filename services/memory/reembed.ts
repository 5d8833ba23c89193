// `troupe memory reembed`: moves every memory to another embedder's vectors. The memory table
// refuses vectors of two embedders (store.ts), so changing the embedding model needs this:
//
//   1. a new table is written beside the old one: every row as it was, with the text embedded
//      again by the configured embedder (in batches; the endpoint's failures stop the run);
//   2. its full-text and scalar indexes are built (the vector index follows with the service's
//      maintenance once the table is large enough);
//   3. if the old table changed meanwhile (the memory service was still writing), nothing is
//      switched: run again with the service stopped;
//   4. the pointer in META_TABLE is moved to the new table in one commit, then the old table is
//      dropped (--keep-old keeps it).
//
// A run that dies before step 4 leaves the old table in use and a partial new one, which the next
// run drops. The history table is not touched: it holds texts, not vectors.
import type { Logger } from "../shared/process/log.js";
import type { Embedder } from "./embedder.js";
import { MEMORY_COLUMNS, memoryArrow, schemaFor, type StoredMemory } from "./memory-schema.js";
import { activeTable, connectMemoryDb, indexNewTable, setActiveTable } from "./meta.js";

/** New tables are named memories_r<base-36 time>; anything of that shape not in use is a leftover. */
const REEMBED_TABLE = /^memories_r[0-9a-z]+$/;

export interface ReembedResult {
  rows: number;
  from: { table: string; embedder: string };
  to: { table: string; embedder: string };
  ms: number;
}

export async function reembed(
  uri: string,
  storageOptions: Record<string, string>,
  embedder: Embedder,
  logger: Logger,
  options: {
    batch?: number;
    keepOld?: boolean;
    onProgress?: (done: number, total: number) => void;
    /** The caps on LanceDB's metadata and index caches, as the service's (connectMemoryDb). */
    metadataCacheBytes?: number;
    indexCacheBytes?: number;
  } = {},
): Promise<ReembedResult> {
  const started = Date.now();
  const batchSize = options.batch ?? 256;
  const db = await connectMemoryDb(uri, storageOptions, options.metadataCacheBytes, options.indexCacheBytes);
  try {
    const names = await db.tableNames();
    const active = await activeTable(db);
    if (!names.includes(active)) throw new Error(`there is no memory table at ${uri} (looked for ${active})`);
    for (const n of names) {
      if (REEMBED_TABLE.test(n) && n !== active) {
        logger.info(`dropping ${n}, left by an earlier re-embed that did not finish`);
        await db.dropTable(n);
      }
    }
    const old = await db.openTable(active);
    const version = await old.version();
    const total = await old.countRows();
    const sample = (await old.query().select(["embedder"]).limit(1).toArray()) as { embedder: string }[];
    const fromEmbedder = sample[0]?.embedder ?? "(empty table)";
    const target = `memories_r${Date.now().toString(36)}`;
    const schema = schemaFor(embedder.dim);
    const fresh = await db.createEmptyTable(target, schema);
    let pending: StoredMemory[] = [];
    let done = 0;
    const flush = async () => {
      if (pending.length === 0) return;
      const vectors = await embedder.embed(pending.map((r) => r.text));
      await fresh.add(
        memoryArrow(
          schema,
          pending.map((r, i) => ({ ...r, vector: vectors[i], embedder: embedder.name })),
        ),
      );
      done += pending.length;
      pending = [];
      options.onProgress?.(done, total);
    };
    for await (const batch of old.query().select(MEMORY_COLUMNS)) {
      for (const row of batch.toArray()) {
        pending.push(row.toJSON() as StoredMemory);
        if (pending.length >= batchSize) await flush();
      }
    }
    await flush();
    await indexNewTable(fresh, done);
    await old.checkoutLatest();
    if ((await old.version()) !== version) {
      await db.dropTable(target);
      throw new Error(
        `the memory table changed while it was re-embedded (version ${version} -> ${await old.version()}): is the memory service running? Nothing was switched; stop it and run again`,
      );
    }
    if (done !== total) throw new Error(`read ${done} of ${total} memories; nothing was switched`);
    await setActiveTable(db, target);
    old.close();
    fresh.close();
    if (!options.keepOld) await db.dropTable(active);
    return {
      rows: done,
      from: { table: active, embedder: fromEmbedder },
      to: { table: target, embedder: embedder.name },
      ms: Date.now() - started,
    };
  } finally {
    db.close();
  }
}
