// `troupe memory`: the operator's view of the memory service.
//   troupe memory add --tenant T --owner O [--agent A] [--evergreen] TEXT
//   troupe memory search --tenant T --owner O [--agent A] [-k N] [--debug] QUERY
//   troupe memory forget --tenant T --owner O ID...
//   troupe memory stats
import { internalCredentials } from "../shared/auth.js";
import { loadConfig } from "../shared/config.js";
import { describeError } from "../shared/errors.js";
import { AddOutcome, MemoryService } from "../shared/gen/troupe/v1/memory_pb.js";
import { createClient } from "../shared/rpc.js";

const USAGE = `usage: troupe memory add --tenant T --owner O [--agent A] [--evergreen] TEXT
       troupe memory search --tenant T --owner O [--agent A] [-k N] [--debug] QUERY
       troupe memory forget --tenant T --owner O ID...
       troupe memory stats
`;

export async function memoryCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const cfg = loadConfig(rest, process.env, {
    tenant: { type: "string" },
    owner: { type: "string" },
    agent: { type: "string" },
    k: { type: "string", short: "k" },
    evergreen: { type: "boolean" },
    debug: { type: "boolean" },
  });
  const f = cfg.flags as Record<string, string | boolean | undefined>;
  const scope = { tenant: (f.tenant as string) ?? "", owner: (f.owner as string) ?? "", agentId: (f.agent as string) ?? "" };
  const text = cfg.rest.join(" ").trim();
  const client = createClient(MemoryService, cfg.addr.memory, { headers: (await internalCredentials(cfg.dataDir)).headers });
  try {
    switch (sub) {
      case "add": {
        if (!text) break;
        const res = await client.addMemories({ scope: { ...scope, agentId: scope.agentId || "main" }, memories: [{ text, evergreen: f.evergreen === true, provenance: "cli" }] });
        process.stdout.write(`${res.results[0]?.outcome === AddOutcome.DUPLICATE ? "already stored as" : "stored as"} ${res.ids[0]}\n`);
        return 0;
      }
      case "search": {
        if (!text) break;
        const res = await client.searchMemories({ scope, query: text, k: Number(f.k ?? 5), options: { debug: f.debug === true } });
        for (const r of res.results) {
          const s = r.stages;
          const detail = s ? `  [vector ${s.vector.toFixed(3)} text ${s.text.toFixed(3)} fused ${s.fused.toFixed(3)} decayed ${s.decayed.toFixed(3)} mmr ${s.mmr.toFixed(3)}]` : "";
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
        process.stdout.write(`rows ${s.rows}\nembedder ${s.embedder} (${s.dimension} dimensions)\nvector index ${s.vectorIndexed ? `yes (${s.unindexedRows} rows not yet in it)` : "no (exact search)"}\ntable version ${s.tableVersion}\n`);
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
