// The memory service: memories in LanceDB (store.ts), found by meaning and by words and re-ranked
// (ranking.ts), every call confined to one scope. The scope is one combined predicate built from
// values held to a strict alphabet, applied before the vector and full-text searches; no request
// text ever reaches LanceDB's filter language except as such a checked value.
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { trace } from "@opentelemetry/api";
import { instruments, secondsSince } from "../shared/process/metrics.js";
import { internalCredentials, internalServing, NAME } from "../shared/auth/auth.js";
import type { Config } from "../shared/config/config-types.js";
import { invalidArgument, invalidArgumentIf } from "../shared/errors.js";
import { validateSessionRef } from "../shared/frames.js";
import {
  Fusion,
  MemoryKind,
  MemorySchema,
  MemoryService,
  AddOutcome,
  type MemoryScope,
  type SearchOptions,
} from "../shared/gen/troupe/v1/memory_pb.js";
import type { Logger } from "../shared/process/log.js";
import { RpcServer } from "../shared/rpc.js";
import type { RunningService } from "../shared/process/service.js";
import { modelBaseUrl } from "../shared/config/config.js";
import { loadProviders, resolveModel, singleProvider, type Providers } from "../shared/models/providers.js";
import { LocalEmbedder, OpenAIEmbedder, traced, type Embedder } from "./embedder.js";
import { Learner } from "./learn.js";
import { DEFAULT_RANKING, rank, type RankOptions, type Ranked } from "./ranking.js";
import { EVENT, newMemoryRow, sqlString, type StoredCandidate, type StoredMemory } from "./memory-schema.js";
import { MemoryStore } from "./store.js";
import { PROVIDER_KINDS } from "../shared/models/provider-kinds.js";

const MAX_TEXT_CHARS = 8000;
const MAX_BATCH = 1000;
const MAX_POOL = 200;
// Scope values and ids are interpolated into LanceDB's filter language, so they are held to an
// alphabet in which no quote, operator or keyword can be written: scope values to the one tenants
// and principals are held to (auth.ts NAME), ids to a narrower one.
const MEMORY_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** The one predicate a call is confined to. */
export function scopePredicate(scope: MemoryScope | undefined, forWrite: boolean): string {
  if (!scope) throw invalidArgument("scope is required");
  const value = (name: string, v: string) => {
    if (!NAME.test(v))
      throw invalidArgument(
        `scope.${name} ${v === "" ? "is required" : "has characters outside A-Z a-z 0-9 . _ : @ -"}`,
      );
    return sqlString(v);
  };
  const parts = [`tenant = ${value("tenant", scope.tenant)}`];
  if (scope.allOwners) {
    invalidArgumentIf(forWrite, "scope.all_owners is for searches; a write names its owner");
    invalidArgumentIf(scope.agentId === "", "scope.all_owners needs scope.agent_id: it reads what one agent learned");
  } else {
    parts.push(`owner = ${value("owner", scope.owner)}`);
  }
  if (forWrite && scope.agentId === "") throw invalidArgument("scope.agent_id is required to write");
  if (scope.agentId !== "") parts.push(`agent_id = ${value("agent_id", scope.agentId)}`);
  return parts.join(" AND ");
}

export function rankOptions(
  o: SearchOptions | undefined,
  k: number,
): RankOptions & { poolFactor: number; hybrid: boolean } {
  const num = (v: number | undefined, name: string, lo: number, hi: number, fallback: number) => {
    if (v === undefined) return fallback;
    invalidArgumentIf(!Number.isFinite(v) || v < lo || v > hi, `options.${name} must be between ${lo} and ${hi}`);
    return v;
  };
  return {
    k,
    nowMs: Date.now(),
    poolFactor: num(o?.poolFactor, "pool_factor", 1, 50, 4),
    hybrid: o?.hybrid ?? true,
    fusion: o?.fusion === Fusion.RRF ? "rrf" : "weighted",
    vectorWeight: num(o?.vectorWeight, "vector_weight", 0, 1, DEFAULT_RANKING.vectorWeight),
    textWeight: num(o?.textWeight, "text_weight", 0, 1, DEFAULT_RANKING.textWeight),
    rrfK: DEFAULT_RANKING.rrfK,
    halfLifeDays: num(o?.halfLifeDays, "half_life_days", 0, 36500, DEFAULT_RANKING.halfLifeDays),
    mmrLambda: num(o?.mmrLambda, "mmr_lambda", 0, 1, DEFAULT_RANKING.mmrLambda),
    minScore: num(o?.minScore, "min_score", -1, 1, DEFAULT_RANKING.minScore),
  };
}

function checkText(text: string, what: string): string {
  const t = text.trim();
  invalidArgumentIf(t === "", `${what} must not be empty`);
  invalidArgumentIf(t.length > MAX_TEXT_CHARS, `${what} is over ${MAX_TEXT_CHARS} characters`);
  return t;
}

/**
 * The search pipeline: vector and (when hybrid) full-text candidates, one per memory with both
 * scores when both searches found it, then ranking.ts's stages. Each candidate carries its whole
 * memory, so the winners are returned as the searches read them.
 */
export async function search(
  store: MemoryStore,
  where: string,
  query: string,
  vector: Float32Array,
  o: RankOptions & { poolFactor: number; hybrid: boolean },
): Promise<{ ranked: Ranked[]; candidates: Map<string, StoredCandidate> }> {
  const pool = Math.min(MAX_POOL, o.k * o.poolFactor);
  const [byVector, byText] = await Promise.all([
    store.vectorCandidates(where, vector, pool),
    o.hybrid ? store.textCandidates(where, query, pool) : Promise.resolve([]),
  ]);
  const candidates = new Map<string, StoredCandidate>();
  for (const c of byVector) candidates.set(c.id, c);
  for (const c of byText) {
    const seen = candidates.get(c.id);
    if (seen) seen.textScore = c.textScore;
    else candidates.set(c.id, c);
  }
  return { ranked: rank([...candidates.values()], o), candidates };
}

/** The providers the configuration names (shared/models/providers.ts). */
const providersOf = (cfg: Config): Providers =>
  cfg.providersFile
    ? loadProviders(cfg.providersFile)
    : singleProvider(modelBaseUrl(cfg), cfg.openaiApiKey, cfg.openaiAccount);

/** The provider serving `model`, or a start-up error that says what to write. */
function served(providers: Providers, model: string, setting: string) {
  const found = resolveModel(providers, model);
  if (!found)
    throw new Error(
      `${setting}=${model}: no provider serves it; name it as provider/model with one of ${[...providers.byName.keys()].join(", ")}`,
    );
  return found;
}

/** The embedder the configuration names: a provider's model, else the built-in one. */
export function embedderFor(cfg: Config, providers = providersOf(cfg)): Embedder {
  if (cfg.embeddingModel === "") return new LocalEmbedder();
  const { provider, model } = served(providers, cfg.embeddingModel, "TROUPE_EMBEDDING_MODEL");
  if (!PROVIDER_KINDS[provider.kind].embeddings)
    throw new Error(
      `TROUPE_EMBEDDING_MODEL=${cfg.embeddingModel}: provider ${provider.name} is of kind ${provider.kind}, which serves no embeddings; name an OpenAI or OpenAI-compatible provider's model`,
    );
  return new OpenAIEmbedder(provider.baseUrl, provider.apiKey, model, cfg.embeddingDim, provider.headers);
}

export async function startMemory(cfg: Config, logger: Logger): Promise<RunningService> {
  const listenTls = internalServing(cfg, "memory service");
  const providers = providersOf(cfg);
  const embedder = traced(embedderFor(cfg, providers));
  const { memoryUri: uri, memoryStorageOptions: storageOptions } = cfg;
  const store = await MemoryStore.open(uri, storageOptions, embedder.name, embedder.dim, logger, {
    metadataCacheBytes: cfg.memoryMetadataCacheMb * 1024 * 1024,
    indexCacheBytes: cfg.memoryIndexCacheMb * 1024 * 1024,
    reconnectCommits: cfg.memoryReconnectCommits,
  });
  const learning = served(providers, cfg.learningModel || cfg.model, "TROUPE_LEARNING_MODEL");
  const learner = new Learner(learning.provider, learning.model, store, embedder, logger);
  // Every 10 minutes, and then the vector index is built even if writes never pause.
  const maintenance = setInterval(() => store.maintainInBackground("now"), 10 * 60_000);
  maintenance.unref();

  const toMemory = (r: StoredMemory) =>
    create(MemorySchema, {
      id: r.id,
      scope: { tenant: r.tenant, owner: r.owner, agentId: r.agent_id },
      sessionId: r.session_id,
      kind: r.kind,
      text: r.text,
      createTime: timestampFromMs(Number(r.created)),
      updateTime: timestampFromMs(Number(r.updated)),
      importance: r.importance,
      evergreen: r.evergreen,
      provenance: r.provenance,
      metadata: JSON.parse(r.metadata || "{}") as Record<string, string>,
      contentHash: r.content_hash,
    });

  const server = new RpcServer({
    maxMessageBytes: cfg.maxMessageBytes,
    authenticate: (await internalCredentials(cfg.dataDir, cfg.internalToken)).authenticate,
    logger,
  });
  server.add(MemoryService, {
    async addMemories(req) {
      const where = scopePredicate(req.scope, true);
      const scope = req.scope!;
      invalidArgumentIf(req.memories.length === 0, "memories must not be empty");
      invalidArgumentIf(req.memories.length > MAX_BATCH, `at most ${MAX_BATCH} memories per call`);
      const upserts = new Set<string>();
      const texts = req.memories.map((m, i) => {
        invalidArgumentIf(
          m.id !== "" && !MEMORY_ID.test(m.id),
          `memories[${i}].id has characters outside A-Z a-z 0-9 . _ : -`,
        );
        invalidArgumentIf(!(m.kind in MemoryKind), `memories[${i}].kind is not a known kind`);
        invalidArgumentIf(
          !(m.importance >= 0 && m.importance <= 1),
          `memories[${i}].importance must be between 0 and 1`,
        );
        if (m.id) upserts.add(m.id);
        return checkText(m.text, `memories[${i}].text`);
      });
      invalidArgumentIf(upserts.size !== req.memories.filter((m) => m.id).length, "an id appears twice in one batch");
      // Embedded before anything is written: a failing embedder stores nothing (UNAVAILABLE).
      const vectors = await embedder.embed(texts);
      const rows = req.memories.map((m, i) =>
        newMemoryRow({
          ...(m.id ? { id: m.id } : {}),
          ...(m.kind !== MemoryKind.UNSPECIFIED ? { kind: m.kind } : {}),
          ...(m.importance ? { importance: m.importance } : {}),
          tenant: scope.tenant,
          owner: scope.owner,
          agent_id: scope.agentId,
          session_id: m.sessionId,
          text: texts[i],
          vector: vectors[i],
          evergreen: m.evergreen,
          provenance: m.provenance,
          metadata: JSON.stringify(m.metadata),
          embedder: embedder.name,
        }),
      );
      const results = await store.add(where, rows, upserts);
      const outcome = { added: AddOutcome.ADDED, updated: AddOutcome.UPDATED, duplicate: AddOutcome.DUPLICATE };
      return {
        ids: results.map((r) => r.id),
        results: results.map((r) => ({ id: r.id, outcome: outcome[r.outcome] })),
      };
    },

    async searchMemories(req) {
      const where = scopePredicate(req.scope, false);
      invalidArgumentIf(req.k < 0 || req.k > 100, "k must be between 1 and 100 (0 means 5)");
      const query = checkText(req.query, "query");
      const k = req.k || 5;
      const o = rankOptions(req.options, k);
      const searchStarted = performance.now();
      const [vector] = await embedder.embed([query]);
      invalidArgumentIf(req.longTermK < 0 || req.longTermK > 100, "long_term_k must be between 0 and 100");
      const { ranked, candidates } = await search(store, where, query, vector, o);
      instruments().memorySearch.record(secondsSince(searchStarted));
      trace.getActiveSpan()?.setAttribute("troupe.memory.results", ranked.length);
      const results = ranked.map((r) => ({
        memory: toMemory(candidates.get(r.id)!.memory),
        score: r.score,
        stages: req.options?.debug ? r.stages : undefined,
      }));
      if (req.longTermK > 0) {
        // The long-term facts, by relevance, none dropped for a low score or for looking alike.
        const factsOnly = `(${where}) AND kind IN (${MemoryKind.FACT}, ${MemoryKind.PROFILE})`;
        const facts = await search(store, factsOnly, query, vector, {
          ...rankOptions(undefined, req.longTermK),
          minScore: 0,
          mmrLambda: 1,
        });
        const seen = new Set(ranked.map((r) => r.id));
        for (const r of facts.ranked)
          if (!seen.has(r.id))
            results.push({ memory: toMemory(facts.candidates.get(r.id)!.memory), score: r.score, stages: undefined });
      }
      return { results };
    },

    async forgetMemories(req) {
      const where = scopePredicate(req.scope, false);
      if (req.sessionId !== "") {
        invalidArgumentIf(req.ids.length > 0, "name ids or session_id, not both");
        validateSessionRef(req.sessionId, "", false);
        return { forgotten: await store.forget(where, await store.idsMadeIn(where, req.sessionId)) };
      }
      invalidArgumentIf(req.ids.length === 0 || req.ids.length > MAX_BATCH, `ids must hold 1 to ${MAX_BATCH} ids`);
      for (const id of req.ids)
        invalidArgumentIf(!MEMORY_ID.test(id), `id ${JSON.stringify(id.slice(0, 64))} is not a memory id`);
      return { forgotten: await store.forget(where, req.ids) };
    },

    async learnFromTurn(req) {
      const where = scopePredicate(req.scope, true);
      invalidArgumentIf(req.messages.length === 0 || req.messages.length > 100, "messages must hold 1 to 100 messages");
      const exchange = req.messages.map((m, i) => {
        invalidArgumentIf(m.role !== "user" && m.role !== "assistant", `messages[${i}].role must be user or assistant`);
        return { role: m.role, text: m.text.slice(0, MAX_TEXT_CHARS) };
      });
      invalidArgumentIf(req.source !== "" && !NAME.test(req.source), "source must be 1-128 of A-Z a-z 0-9 . _ : @ -");
      const changes = await learner.learn(
        { tenant: req.scope!.tenant, owner: req.scope!.owner, agentId: req.scope!.agentId },
        where,
        req.sessionId,
        exchange,
        req.source,
      );
      const now = timestampFromMs(Date.now());
      return {
        changes: changes.map((c) => ({
          event: EVENT[c.event],
          memoryId: c.memoryId,
          oldText: c.oldText,
          newText: c.newText,
          time: now,
          actor: `learn:${req.sessionId}`,
        })),
      };
    },

    async getMemoryHistory(req) {
      const where = scopePredicate(req.scope, false);
      invalidArgumentIf(req.memoryId !== "" && !MEMORY_ID.test(req.memoryId), "memory_id is not a memory id");
      const rows = await store.history(where, req.memoryId);
      return {
        changes: rows.map((r) => ({
          event: r.event,
          memoryId: r.memory_id,
          oldText: r.old_text,
          newText: r.new_text,
          time: timestampFromMs(r.time),
          actor: r.actor,
        })),
      };
    },

    async getMemoryStats() {
      const s = await store.stats();
      return {
        rows: BigInt(s.rows),
        embedder: store.embedder,
        dimension: store.dim,
        vectorIndexed: s.indexed,
        unindexedRows: BigInt(s.unindexed),
        tableVersion: BigInt(s.version),
      };
    },
  });
  const port = await server.listen(cfg.addr.memory, listenTls);
  logger.info(`memory serving on port ${port}`, { store: uri, embedder: embedder.name });
  return {
    async drain() {
      clearInterval(maintenance);
      await server.drain(cfg.drainGraceMs);
      store.close();
      await server.close();
    },
  };
}
