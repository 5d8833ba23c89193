// `troupe memory reembed` against a real memory service and LanceDB files: every memory is
// embedded anew into a new table, the pointer switches in one commit, and a store opened with the
// old embedder refuses the table and says how to fix it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import path from "node:path";
import { MemoryService, type ScoredMemory } from "../services/shared/gen/troupe/v1/memory_pb.js";
import { MemoryStore } from "../services/memory/store.js";
import { createLogger } from "../services/shared/process/log.js";
import { MAIN, startStack, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);

const texts = (rs: ScoredMemory[]) => rs.map((r) => r.memory!.text);

describe("re-embedding (troupe memory reembed)", () => {
  let stack: Stack;
  const newEmbedder = (modelServer: string) => ({
    TROUPE_EMBEDDING_MODEL: "scripted-embed-2",
    TROUPE_EMBEDDING_DIM: "256",
    OPENAI_BASE_URL: `http://${modelServer}/v1`,
  });
  before(async () => {
    stack = await startStack({ services: ["model-server", "memory"] });
  });
  after(async () => {
    await stack?.stop();
  });
  const reembedCli = (env: NodeJS.ProcessEnv) =>
    run(process.execPath, [MAIN, "memory", "reembed", "--data-dir", stack.dataDir, "--batch", "100"], {
      env: { ...process.env, ...env },
    });

  test("a running service's writes stop the switch; stopped, every memory moves to the new embedder and nothing else changes", async () => {
    let memory = stack.client(MemoryService, stack.addr.memory);
    const scope = { tenant: "acme", owner: "gus", agentId: "main" };
    for (let b = 0; b < 3; b++) {
      await memory.addMemories({
        scope,
        memories: Array.from({ length: 1000 }, (_, i) => ({
          text: `note ${b * 1000 + i} about the greenhouse and its tomato plants number ${i % 41}`,
        })),
      });
    }
    const { ids } = await memory.addMemories({
      scope,
      memories: [{ text: "Gus waters the orchids on Sundays", evergreen: true }, { text: "Gus dislikes loud music" }],
    });
    await memory.forgetMemories({ scope, ids: [ids[1]] });
    const before = await memory.getMemoryStats({});
    const history = (await memory.getMemoryHistory({ scope })).changes.length;

    // With the service writing all along, the table changes under the copy: nothing is switched.
    let writing = true;
    const writer = (async () => {
      for (let i = 0; writing; i++)
        await memory.addMemories({ scope: { ...scope, owner: "writer" }, memories: [{ text: `live write ${i}` }] });
    })();
    const raced = await reembedCli(newEmbedder(stack.addr["model-server"])).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    writing = false;
    await writer;
    assert.equal(raced?.code, 1);
    assert.match(raced!.stderr, /changed while it was re-embedded .* Nothing was switched/);
    assert.equal((await memory.getMemoryStats({})).embedder, before.embedder);
    const rows = (await memory.getMemoryStats({})).rows;
    memory.close();

    await stack.kill("memory", "SIGTERM");
    const done = await reembedCli(newEmbedder(stack.addr["model-server"]));
    assert.match(
      done.stdout,
      new RegExp(
        `^re-embedded ${rows} memories in \\d+ ms: memories_v2 \\(troupe-hash-v1\\) -> memories_r\\w+ \\(openai:scripted-embed-2:256\\)\\n$`,
      ),
    );
    // A store opened with the old embedder now refuses the table, and says how to fix it.
    await assert.rejects(
      MemoryStore.open(path.join(stack.dataDir, "memory"), {}, "troupe-hash-v1", 256, createLogger("test", "error")),
      /embedded by openai:scripted-embed-2:256 and this service embeds with troupe-hash-v1.*troupe memory reembed/,
    );
    const addr = await stack.startInstance("memory-new", "memory", { env: newEmbedder(stack.addr["model-server"]) });
    memory = stack.client(MemoryService, addr);
    const after = await memory.getMemoryStats({});
    assert.deepEqual([after.rows, after.embedder, after.dimension], [rows, "openai:scripted-embed-2:256", 256]);
    const found = await memory.searchMemories({ scope, query: "who waters the orchids", k: 1 });
    assert.deepEqual(texts(found.results), ["Gus waters the orchids on Sundays"]);
    assert.equal(found.results[0].memory!.evergreen, true);
    assert.equal((await memory.getMemoryHistory({ scope })).changes.length, history);
    assert.equal(
      (await memory.searchMemories({ scope, query: "loud music", k: 5 })).results.some((r) =>
        /loud music/.test(r.memory!.text),
      ),
      false,
    );
    memory.close();
  });
});
