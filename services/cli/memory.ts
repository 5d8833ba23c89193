// `troupe memory`: the operator's view of the memory service.
//   troupe memory add --tenant T --owner O [--agent A] [--evergreen] TEXT
//   troupe memory search --tenant T --owner O [--agent A] [-k N] [--debug] QUERY
//   troupe memory forget --tenant T --owner O ID...
//   troupe memory stats
//   troupe memory reembed [--batch N] [--keep-old]   (offline: with the memory service stopped)
import { internalCredentials } from "../shared/auth/auth.js";
import { loadConfig } from "../shared/config/config.js";
import { useOutboundProxy } from "../shared/net/outbound-proxy.js";
import { describeError } from "../shared/errors.js";
import { AddOutcome, MemoryService } from "../shared/gen/troupe/v1/memory_pb.js";
import { createClient } from "../shared/rpc.js";
import type { Config } from "../shared/config/config-types.js";
import { createLogger } from "../shared/process/log.js";
import { reembed } from "../memory/reembed.js";
import { embedderFor } from "../memory/server.js";

/** Offline: it opens the store itself, so it needs no running service (and must not race one). */
async function reembedCommand(cfg: Config, f: Record<string, string | boolean | undefined>): Promise<number> {
  try {
    const batch = f.batch === undefined ? 256 : Number(f.batch);
    if (!Number.isInteger(batch) || batch < 1 || batch > 4096)
      throw new Error("--batch must be an integer from 1 to 4096");
    const embedder = embedderFor(cfg);
    const { memoryUri: uri, memoryStorageOptions: storageOptions } = cfg;
    let shown = 0;
    const res = await reembed(uri, storageOptions, embedder, createLogger("memory", cfg.logLevel), {
      batch,
      keepOld: f["keep-old"] === true,
      metadataCacheBytes: cfg.memoryMetadataCacheMb * 1024 * 1024,
      indexCacheBytes: cfg.memoryIndexCacheMb * 1024 * 1024,
      onProgress(done, total) {
        if (done - shown >= 10_000 || done === total) {
          shown = done;
          process.stderr.write(`re-embedded ${done} of ${total}\n`);
        }
      },
    });
    process.stdout.write(
      `re-embedded ${res.rows} memories in ${res.ms} ms: ${res.from.table} (${res.from.embedder}) -> ${res.to.table} (${res.to.embedder})${f["keep-old"] ? `; ${res.from.table} kept` : ""}\n`,
    );
    return 0;
  } catch (err) {
    process.stderr.write(`troupe memory reembed: ${describeError(err)}\n`);
    return 1;
  }
}

const USAGE = `usage: troupe memory add --tenant T --owner O [--agent A] [--evergreen] TEXT
       troupe memory search --tenant T --owner O [--agent A] [-k N] [--debug] QUERY
       troupe memory forget --tenant T --owner O ID...
       troupe memory stats
       troupe memory reembed [--batch N] [--keep-old]
         Embeds every memory again with the embedder configured now (TROUPE_EMBEDDING_MODEL,
         TROUPE_EMBEDDING_DIM, OPENAI_BASE_URL; none: the local one) and switches the store to
         the new vectors. Run it with the memory service stopped, then start the service with
         the same settings.
`;

export async function memoryCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const cfg = loadConfig(rest, undefined, {
    tenant: { type: "string" },
    owner: { type: "string" },
    agent: { type: "string" },
    k: { type: "string", short: "k" },
    evergreen: { type: "boolean" },
    debug: { type: "boolean" },
    batch: { type: "string" },
    "keep-old": { type: "boolean" },
  });
  useOutboundProxy(cfg.outboundProxy);
  const f = cfg.flags as Record<string, string | boolean | undefined>;
  if (sub === "reembed") return reembedCommand(cfg, f);
  const scope = {
    tenant: (f.tenant as string) ?? "",
    owner: (f.owner as string) ?? "",
    agentId: (f.agent as string) ?? "",
  };
  const text = cfg.rest.join(" ").trim();
  const internal = await internalCredentials(cfg.dataDir, cfg.internalToken, cfg.internalCa);
  const client = createClient(MemoryService, cfg.addr.memory, { headers: internal.headers, tls: internal.tls });
  try {
    switch (sub) {
      case "add": {
        if (!text) break;
        const res = await client.addMemories({
          scope: { ...scope, agentId: scope.agentId || "main" },
          memories: [{ text, evergreen: f.evergreen === true, provenance: "cli" }],
        });
        process.stdout.write(
          `${res.results[0]?.outcome === AddOutcome.DUPLICATE ? "already stored as" : "stored as"} ${res.ids[0]}\n`,
        );
        return 0;
      }
      case "search": {
        if (!text) break;
        const res = await client.searchMemories({
          scope,
          query: text,
          k: Number(f.k ?? 5),
          options: { debug: f.debug === true },
        });
        for (const r of res.results) {
          const s = r.stages;
          const detail = s
            ? `  [vector ${s.vector.toFixed(3)} text ${s.text.toFixed(3)} fused ${s.fused.toFixed(3)} decayed ${s.decayed.toFixed(3)} mmr ${s.mmr.toFixed(3)}]`
            : "";
          process.stdout.write(`${r.score.toFixed(3)}  ${r.memory!.id}  ${r.memory!.text}${detail}\n`);
        }
        if (res.results.length === 0) process.stdout.write("(nothing found)\n");
        return 0;
      }
      case "forget": {
        if (cfg.rest.length === 0) break;
        const res = await client.forgetMemories({ scope, ids: cfg.rest });
        process.stdout.write(`forgot ${res.forgotten} of ${cfg.rest.length}\n`);
        return res.forgotten === cfg.rest.length ? 0 : 1;
      }
      case "stats": {
        const s = await client.getMemoryStats({});
        process.stdout.write(
          `rows ${s.rows}\nembedder ${s.embedder} (${s.dimension} dimensions)\nvector index ${s.vectorIndexed ? `yes (${s.unindexedRows} rows not yet in it)` : "no (exact search)"}\ntable version ${s.tableVersion}\n`,
        );
        return 0;
      }
    }
    process.stderr.write(USAGE);
    return 2;
  } catch (err) {
    process.stderr.write(`troupe memory ${sub}: ${describeError(err)}\n`);
    return 1;
  } finally {
    client.close();
  }
}
