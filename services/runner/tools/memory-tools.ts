// The memory tools: what the model may search, save and forget of long-term memory, through the
// memory service. The scope is fixed by the runner for each run (run-deps.ts: the tenant and the
// speaker); no argument names another. A failed call is a tool result the model reads.
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  AddOutcome,
  MemoryKind,
  type MemoryScopeSchema,
  type MemoryService,
} from "../../shared/gen/troupe/v1/memory_pb.js";
import type { ServiceClient } from "../../shared/rpc.js";
import { serviceFailure, type Tool, type ToolContext } from "./tools.js";

type MemoryClient = ServiceClient<(typeof MemoryService)["method"]>;
type MemoryScopeInit = MessageInitShape<typeof MemoryScopeSchema>;

const memoryFailure = (tool: string, err: unknown) => serviceFailure(tool, "memory", err);

/**
 * `memory_search`, `memory_save`, `memory_forget`: the long-term memory of the session's owner
 * (its memory owner for channel sessions). `onSaved` lets the runner's recall forget that the
 * scope was empty.
 */
export function memoryTools(
  memory: MemoryClient,
  scope: MemoryScopeInit,
  agentId: string,
  onSaved: () => void,
): Tool[] {
  const opts = (ctx: ToolContext) => ({ signal: ctx.signal, timeoutMs: 10_000 });
  return [
    {
      name: "memory_search",
      parallel: true,
      description:
        "Search your long-term memory of this user by meaning and by words; returns the most relevant memories with their ids.",
      parameters: {
        type: "object",
        properties: { query: { type: "string" }, k: { type: "integer", minimum: 1, maximum: 20 } },
        required: ["query"],
        additionalProperties: false,
      },
      async execute(args, ctx) {
        if (typeof args.query !== "string" || args.query.trim() === "")
          return { output: "memory_search: `query` must be a non-empty string", isError: true };
        const k = typeof args.k === "number" ? Math.min(20, Math.max(1, Math.floor(args.k))) : 5;
        try {
          const { results } = await memory.searchMemories({ scope, query: args.query, k }, opts(ctx));
          return {
            output: results.length
              ? results.map((r) => `${r.memory!.id}: ${r.memory!.text} (score ${r.score.toFixed(2)})`).join("\n")
              : "(nothing remembered that matches)",
            isError: false,
          };
        } catch (err) {
          return memoryFailure("memory_search", err);
        }
      },
    },
    {
      name: "memory_save",
      description:
        "Save a durable fact about this user or their work to long-term memory (one fact per call). Set evergreen for facts that do not go stale.",
      parameters: {
        type: "object",
        properties: {
          text: { type: "string" },
          evergreen: { type: "boolean" },
          kind: { type: "string", enum: ["fact", "episode", "profile", "note"] },
        },
        required: ["text"],
        additionalProperties: false,
      },
      async execute(args, ctx) {
        if (typeof args.text !== "string" || args.text.trim() === "")
          return { output: "memory_save: `text` must be a non-empty string", isError: true };
        const kinds: Record<string, MemoryKind> = {
          fact: MemoryKind.FACT,
          episode: MemoryKind.EPISODE,
          profile: MemoryKind.PROFILE,
          note: MemoryKind.NOTE,
        };
        try {
          const res = await memory.addMemories(
            {
              scope: { ...scope, agentId },
              memories: [
                {
                  text: args.text,
                  evergreen: args.evergreen === true,
                  kind: kinds[String(args.kind)] ?? MemoryKind.FACT,
                  sessionId: ctx.sessionId,
                  provenance: `agent:${agentId}`,
                },
              ],
            },
            opts(ctx),
          );
          onSaved();
          const r = res.results[0];
          return {
            output: r?.outcome === AddOutcome.DUPLICATE ? `already remembered as ${r.id}` : `saved as ${res.ids[0]}`,
            isError: false,
          };
        } catch (err) {
          return memoryFailure("memory_save", err);
        }
      },
    },
    {
      name: "memory_forget",
      description: "Delete a memory by its id (as memory_search shows it).",
      parameters: {
        type: "object",
        properties: { id: { type: "string" } },
        required: ["id"],
        additionalProperties: false,
      },
      async execute(args, ctx) {
        if (typeof args.id !== "string" || args.id === "")
          return { output: "memory_forget: `id` must be a memory id", isError: true };
        try {
          const { forgotten } = await memory.forgetMemories({ scope, ids: [args.id] }, opts(ctx));
          return forgotten > 0
            ? { output: `forgot ${args.id}`, isError: false }
            : { output: `no memory ${args.id} here`, isError: true };
        } catch (err) {
          return memoryFailure("memory_forget", err);
        }
      },
    },
  ];
}
