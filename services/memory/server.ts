// The memory service, first version: memories stored in an embedded LanceDB table under the data
// directory, embedded by the built-in local embedder, found by cosine similarity within a scope.
// Hybrid search, MMR, learning and the rest arrive with the memory issue; the table and the scope
// rule (one combined predicate, applied before the vector search) are already the real ones.
import path from "node:path";
import * as lancedb from "@lancedb/lancedb";
import { Field, FixedSizeList, Float32, Int32, Schema, Timestamp, TimeUnit, Utf8 } from "apache-arrow";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { internalCredentials } from "../shared/auth.js";
import type { Config } from "../shared/config.js";
import { invalidArgument, invalidArgumentIf } from "../shared/errors.js";
import { MemoryKind, MemorySchema, MemoryService, type MemoryScope } from "../shared/gen/troupe/v1/memory_pb.js";
import { HASH_EMBEDDING_DIM, HASH_EMBEDDING_MODEL, hashEmbedding } from "../shared/hash-embedding.js";
import { newId } from "../shared/ids.js";
import type { Logger } from "../shared/log.js";
import { RpcServer } from "../shared/rpc.js";
import type { RunningService } from "../shared/service.js";

const TABLE = "memories";
const MAX_TEXT_CHARS = 8000;
const MAX_BATCH = 1000;
// Scope values are interpolated into LanceDB's filter language, so they are held to an alphabet
// in which no quote, operator or keyword can be written.
const SCOPE_VALUE = /^[A-Za-z0-9._:@-]{1,128}$/;

const schema = new Schema([
  new Field("id", new Utf8(), false),
  new Field("tenant", new Utf8(), false),
  new Field("owner", new Utf8(), false),
  new Field("agent_id", new Utf8(), false),
  new Field("session_id", new Utf8(), false),
  new Field("kind", new Int32(), false),
  new Field("text", new Utf8(), false),
  new Field("vector", new FixedSizeList(HASH_EMBEDDING_DIM, new Field("item", new Float32(), true)), false),
  new Field("created", new Timestamp(TimeUnit.MILLISECOND), false),
  new Field("embedder", new Utf8(), false),
]);

function scopePredicate(scope: MemoryScope | undefined, requireAgent = false): string {
  if (!scope) throw invalidArgument("scope is required");
  const parts: string[] = [];
  for (const [column, value, required] of [
    ["tenant", scope.tenant, true],
    ["owner", scope.owner, true],
    ["agent_id", scope.agentId, requireAgent],
  ] as const) {
    if (value === "") {
      if (required) throw invalidArgument(`scope.${column === "agent_id" ? "agent_id" : column} is required`);
      continue;
    }
    if (!SCOPE_VALUE.test(value)) throw invalidArgument(`scope.${column} has characters outside A-Z a-z 0-9 . _ : @ -`);
    parts.push(`${column} = '${value}'`);
  }
  return parts.join(" AND ");
}

export async function startMemory(cfg: Config, logger: Logger): Promise<RunningService> {
  const db = await lancedb.connect(path.join(cfg.dataDir, "memory"));
  let table: lancedb.Table | undefined;
  // Until the table exists, searches would ask LanceDB for its table list every time; another
  // replica may create it, so "missing" is only believed for a second.
  let missingUntil = 0;
  const openTable = async (createIfMissing: boolean): Promise<lancedb.Table | undefined> => {
    if (table) return table;
    if (!createIfMissing && Date.now() < missingUntil) return undefined;
    const names = await db.tableNames();
    if (names.includes(TABLE)) table = await db.openTable(TABLE);
    else if (createIfMissing) table = await db.createEmptyTable(TABLE, schema, { existOk: true });
    else missingUntil = Date.now() + 1000;
    return table;
  };
  await openTable(false);

  const server = new RpcServer({ maxMessageBytes: cfg.maxMessageBytes, authenticate: (await internalCredentials(cfg.dataDir)).authenticate });
  server.add(MemoryService, {
    async addMemories(req) {
      scopePredicate(req.scope, true);
      invalidArgumentIf(req.memories.length === 0, "memories must not be empty");
      invalidArgumentIf(req.memories.length > MAX_BATCH, `at most ${MAX_BATCH} memories per call`);
      const now = Date.now();
      const rows = req.memories.map((m, i) => {
        const text = m.text.trim();
        invalidArgumentIf(text === "", `memories[${i}].text must not be empty`);
        invalidArgumentIf(text.length > MAX_TEXT_CHARS, `memories[${i}].text is over ${MAX_TEXT_CHARS} characters`);
        return {
          id: newId(),
          tenant: req.scope!.tenant,
          owner: req.scope!.owner,
          agent_id: req.scope!.agentId,
          session_id: m.sessionId,
          kind: m.kind === MemoryKind.UNSPECIFIED ? MemoryKind.FACT : m.kind,
          text,
          vector: Array.from(hashEmbedding(text)),
          created: now,
          embedder: HASH_EMBEDDING_MODEL,
        };
      });
      // One add is one LanceDB commit: the batch lands whole or not at all.
      await (await openTable(true))!.add(rows);
      return { ids: rows.map((r) => r.id) };
    },

    async searchMemories(req) {
      const predicate = scopePredicate(req.scope);
      invalidArgumentIf(req.k < 0 || req.k > 100, "k must be between 1 and 100 (0 means 5)");
      invalidArgumentIf(req.query.trim() === "", "query must not be empty");
      invalidArgumentIf(req.query.length > MAX_TEXT_CHARS, `query is over ${MAX_TEXT_CHARS} characters`);
      const t = await openTable(false);
      if (!t) return { results: [] };
      const rows = await t
        .vectorSearch(Array.from(hashEmbedding(req.query)))
        .distanceType("cosine")
        .where(predicate)
        .limit(req.k || 5)
        .toArray();
      return {
        results: rows.map((r) => ({
          score: 1 - Number(r._distance),
          memory: create(MemorySchema, {
            id: r.id,
            scope: { tenant: r.tenant, owner: r.owner, agentId: r.agent_id },
            sessionId: r.session_id,
            kind: r.kind,
            text: r.text,
            createTime: timestampFromMs(Number(r.created)),
          }),
        })),
      };
    },
  });
  const port = await server.listen(cfg.addr.memory);
  logger.info(`memory serving on port ${port}`, { store: path.join(cfg.dataDir, "memory") });
  return {
    async drain() {
      await server.drain(cfg.drainGraceMs);
      db.close();
    },
  };
}
