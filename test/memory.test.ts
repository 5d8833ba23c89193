// The memory service against real LanceDB files through gRPC: hybrid search with stage scores,
// MMR through the API, duplicates stored once, upserts, isolation between tenants and owners
// (and the owner's view of everything the agent learned), bad input, an embedding endpoint that
// is down, a batch cut short by a crash, and the runner's memory tools.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  AddOutcome,
  MemoryService,
  type MemoryKind,
  type ScoredMemory,
} from "../services/shared/gen/troupe/v1/memory_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../services/shared/errors.js";
import type { ServiceClient } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { MAIN, startStack, waitFor, type Stack } from "./helpers/stack.js";
import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);

type Memory = ServiceClient<(typeof MemoryService)["method"]>;
const texts = (rs: ScoredMemory[]) => rs.map((r) => r.memory!.text);

describe("the memory service", () => {
  let stack: Stack;
  let memory: Memory;
  before(async () => {
    stack = await startStack({ services: ["model-server", "memory"] });
    memory = stack.client(MemoryService, stack.addr.memory);
  });
  after(async () => {
    memory?.close();
    await stack?.stop();
  });

  const acme = (owner: string) => ({ tenant: "acme", owner, agentId: "main" });

  test("hybrid search: both searches' scores in debug; a word only the full-text side knows still counts", async () => {
    await memory.addMemories({
      scope: acme("alice"),
      memories: [
        { text: "Alice's locker code is ZX-4471" },
        { text: "Alice prefers green tea in the morning" },
        { text: "Alice's dog is called Biscuit" },
        { text: "The team meets on Thursdays" },
      ],
    });
    const hybrid = await memory.searchMemories({
      scope: acme("alice"),
      query: "ZX-4471",
      k: 2,
      options: { debug: true },
    });
    assert.equal(hybrid.results[0].memory!.text, "Alice's locker code is ZX-4471");
    assert.ok(hybrid.results[0].stages!.text > 0, "found by BM25 too");
    assert.ok(hybrid.results[0].stages!.vector > 0);
    const vectorOnly = await memory.searchMemories({
      scope: acme("alice"),
      query: "ZX-4471",
      k: 2,
      options: { hybrid: false, debug: true },
    });
    assert.ok(
      vectorOnly.results.every((r) => r.stages!.text === 0),
      "no full-text scores when hybrid is off",
    );
    const rrf = await memory.searchMemories({
      scope: acme("alice"),
      query: "ZX-4471",
      k: 2,
      options: { fusion: 2, debug: true },
    });
    assert.ok(
      rrf.results[0].stages!.fused > 0 && rrf.results[0].stages!.fused < 0.04,
      "RRF scores are 1/(60+rank) sums",
    );
  });

  test("MMR: near-duplicates give way to other relevant memories; lambda 1 is relevance order", async () => {
    const scope = acme("mmr");
    await memory.addMemories({
      scope,
      memories: [
        { text: "the deploy runs on Fridays at noon" },
        { text: "the deploy runs on Fridays at 12:00" },
        { text: "the deploy runs every Friday at noon" },
        { text: "deploy approvals need the release manager" },
        { text: "lunch is at noon" },
      ],
    });
    const plain = texts(
      (await memory.searchMemories({ scope, query: "when does the deploy run", k: 2, options: { mmrLambda: 1 } }))
        .results,
    );
    const diverse = texts(
      (await memory.searchMemories({ scope, query: "when does the deploy run", k: 2, options: { mmrLambda: 0.3 } }))
        .results,
    );
    assert.ok(
      plain.every((t) => t.includes("runs")),
      `relevance order keeps the near-duplicates: ${plain.join(" | ")}`,
    );
    assert.ok(
      diverse.some((t) => !t.includes("runs")),
      `MMR brings in something else: ${diverse.join(" | ")}`,
    );
  });

  test("the same text is stored once per scope; an id given is an upsert; other scopes' ids are refused", async () => {
    const scope = acme("dedupe");
    const first = await memory.addMemories({
      scope,
      memories: [{ text: "Bob  likes  SAILING" }, { text: "bob likes sailing" }],
    });
    assert.deepEqual(
      first.results.map((r) => r.outcome),
      [AddOutcome.ADDED, AddOutcome.DUPLICATE],
    );
    assert.equal(first.ids[0], first.ids[1]);
    const again = await memory.addMemories({ scope, memories: [{ text: "Bob likes sailing" }] });
    assert.deepEqual([again.results[0].outcome, again.ids[0]], [AddOutcome.DUPLICATE, first.ids[0]]);
    // Another owner may remember the same words.
    assert.equal(
      (await memory.addMemories({ scope: acme("other"), memories: [{ text: "Bob likes sailing" }] })).results[0]
        .outcome,
      AddOutcome.ADDED,
    );

    const up = await memory.addMemories({ scope, memories: [{ id: "pref-drink", text: "Bob drinks coffee" }] });
    assert.equal(up.results[0].outcome, AddOutcome.ADDED);
    const changed = await memory.addMemories({ scope, memories: [{ id: "pref-drink", text: "Bob switched to tea" }] });
    assert.equal(changed.results[0].outcome, AddOutcome.UPDATED);
    const found = texts((await memory.searchMemories({ scope, query: "what does Bob drink", k: 5 })).results);
    assert.ok(found.includes("Bob switched to tea") && !found.includes("Bob drinks coffee"), found.join(" | "));
    await assert.rejects(
      memory.addMemories({ scope: acme("mallory"), memories: [{ id: "pref-drink", text: "overwritten" }] }),
      { code: Status.PERMISSION_DENIED },
    );
  });

  test("a batch sent again is all duplicates: the write path's hash filter never hides a stored text", async () => {
    const scope = acme("bulk");
    const batch = Array.from({ length: 1000 }, (_, i) => ({
      text: `bulk fact ${i}: item ${i * 7919} is in bin ${i % 37}`,
    }));
    const first = await memory.addMemories({ scope, memories: batch });
    assert.ok(first.results.every((r) => r.outcome === AddOutcome.ADDED));
    const again = await memory.addMemories({ scope, memories: batch });
    assert.ok(again.results.every((r) => r.outcome === AddOutcome.DUPLICATE));
    assert.deepEqual(again.ids, first.ids);
  });

  test("isolation: tenants and owners never see each other's memories; the owner's all_owners view sees what the agent learned", async () => {
    await memory.addMemories({
      scope: { tenant: "acme", owner: "carol", agentId: "helper" },
      memories: [{ text: "Carol's flight is on Monday" }],
    });
    await memory.addMemories({
      scope: { tenant: "acme", owner: "dan", agentId: "helper" },
      memories: [{ text: "Dan's flight is on Tuesday" }],
    });
    await memory.addMemories({
      scope: { tenant: "globex", owner: "carol", agentId: "helper" },
      memories: [{ text: "Globex Carol's flight is on Sunday" }],
    });
    const q = "when is the flight";
    assert.deepEqual(
      texts((await memory.searchMemories({ scope: { tenant: "acme", owner: "carol" }, query: q, k: 10 })).results),
      ["Carol's flight is on Monday"],
    );
    assert.deepEqual(
      texts((await memory.searchMemories({ scope: { tenant: "globex", owner: "carol" }, query: q, k: 10 })).results),
      ["Globex Carol's flight is on Sunday"],
    );
    const all = texts(
      (
        await memory.searchMemories({
          scope: { tenant: "acme", owner: "", agentId: "helper", allOwners: true },
          query: q,
          k: 10,
        })
      ).results,
    ).sort();
    assert.deepEqual(
      all,
      ["Carol's flight is on Monday", "Dan's flight is on Tuesday"],
      "every owner of the tenant, for that agent; never another tenant",
    );
    // Forgetting by id works only inside the scope.
    const [danId] = (
      await memory.searchMemories({ scope: { tenant: "acme", owner: "dan" }, query: q, k: 1 })
    ).results.map((r) => r.memory!.id);
    assert.equal(
      (await memory.forgetMemories({ scope: { tenant: "acme", owner: "carol" }, ids: [danId] })).forgotten,
      0,
    );
    assert.equal(
      (await memory.searchMemories({ scope: { tenant: "acme", owner: "dan" }, query: q, k: 1 })).results.length,
      1,
    );
    assert.equal((await memory.forgetMemories({ scope: { tenant: "acme", owner: "dan" }, ids: [danId] })).forgotten, 1);
    assert.equal(
      (await memory.searchMemories({ scope: { tenant: "acme", owner: "dan" }, query: q, k: 1 })).results.length,
      0,
    );
  });

  test("bad input is INVALID_ARGUMENT with a clear message; scope values never reach the filter raw", async () => {
    const scope = acme("bad");
    const cases: [Promise<unknown>, RegExp][] = [
      [memory.addMemories({ scope, memories: [{ text: "   " }] }), /text must not be empty/],
      [memory.addMemories({ scope, memories: [{ text: "x".repeat(8001) }] }), /over 8000/],
      [memory.addMemories({ scope, memories: [{ text: "x", kind: 99 as MemoryKind }] }), /not a known kind/],
      [memory.addMemories({ scope, memories: [{ text: "x", importance: 2 }] }), /importance/],
      [memory.addMemories({ scope, memories: [{ text: "x", id: "a b" }] }), /id has characters/],
      [
        memory.addMemories({ scope: { tenant: "acme", owner: "bad" }, memories: [{ text: "x" }] }),
        /agent_id is required to write/,
      ],
      [
        memory.searchMemories({ scope: { tenant: "acme", owner: "x' OR '1'='1" }, query: "q" }),
        /scope\.owner has characters/,
      ],
      [memory.searchMemories({ scope: { tenant: "", owner: "a" }, query: "q" }), /scope\.tenant is required/],
      [
        memory.searchMemories({ scope: { tenant: "acme", owner: "", allOwners: true }, query: "q" }),
        /all_owners needs scope\.agent_id/,
      ],
      [memory.searchMemories({ scope, query: "q", k: 101 }), /k must be between/],
      [memory.searchMemories({ scope, query: "  " }), /query must not be empty/],
      [memory.searchMemories({ scope, query: "q", options: { mmrLambda: 2 } }), /mmr_lambda must be between 0 and 1/],
      [memory.forgetMemories({ scope, ids: ["x') OR 1=1 --"] }), /not a memory id/],
    ];
    for (const [call, why] of cases) {
      await assert.rejects(call, (err: { code: number; details: string }) => {
        assert.equal(err.code, Status.INVALID_ARGUMENT, err.details);
        assert.match(err.details, why);
        return true;
      });
    }
    assert.ok((await memory.getMemoryStats({})).rows > 0n, "still serving");
  });

  test("the operator CLI adds, searches (with stage scores), forgets and counts", async () => {
    const cli = (...args: string[]) =>
      run(process.execPath, [MAIN, "memory", ...args, "--memory", stack.addr.memory, "--data-dir", stack.dataDir]);
    const added = await cli(
      "add",
      "--tenant",
      "ops",
      "--owner",
      "gina",
      "--evergreen",
      "Gina's desk is on the third floor",
    );
    const id = /stored as (\S+)/.exec(added.stdout)![1];
    const found = await cli("search", "--tenant", "ops", "--owner", "gina", "--debug", "where is Gina's desk");
    assert.match(
      found.stdout,
      new RegExp(`${id}  Gina's desk is on the third floor  \\[vector [0-9.]+ text [0-9.]+ fused`),
    );
    assert.match((await cli("stats")).stdout, /embedder troupe-hash-v1 \(256 dimensions\)/);
    assert.match((await cli("forget", "--tenant", "ops", "--owner", "gina", id)).stdout, /forgot 1 of 1/);
    const bad = await cli("search", "--tenant", "ops", "--owner", "x'y", "q").catch(
      (e: { code: number; stderr: string }) => e,
    );
    assert.equal((bad as { code: number }).code, 1);
    assert.match((bad as { stderr: string }).stderr, /INVALID_ARGUMENT: scope\.owner has characters/);
  });

  test("a batch cut short by a crash leaves the table as it was: all of the batch or none, nothing older lost", async () => {
    const scope = acme("crash");
    await memory.addMemories({ scope, memories: [{ text: "stored before the crash" }] });
    const before = (await memory.getMemoryStats({})).rows;
    const batch = memory.addMemories({
      scope,
      memories: Array.from({ length: 1000 }, (_, i) => ({ text: `batch memory number ${i} about topic ${i % 17}` })),
    });
    batch.catch(() => undefined);
    await new Promise((r) => setTimeout(r, 30));
    await stack.kill("memory", "SIGKILL");
    await stack.start("memory");
    const after = (await memory.getMemoryStats({})).rows;
    assert.ok(after === before || after === before + 1000n, `rows ${before} -> ${after}`);
    assert.deepEqual(texts((await memory.searchMemories({ scope, query: "stored before the crash", k: 1 })).results), [
      "stored before the crash",
    ]);
  });
});

describe("with an embedding endpoint", () => {
  let stack: Stack;
  before(async () => {
    stack = await startStack({
      services: ["model-server", "memory"],
      env: { TROUPE_EMBEDDING_MODEL: "scripted-embed", TROUPE_EMBEDDING_DIM: "256" },
    });
  });
  after(async () => {
    await stack?.stop();
  });

  test("vectors come from the endpoint; with it down, writes are UNAVAILABLE and nothing is stored without a vector", async () => {
    const memory = stack.client(MemoryService, stack.addr.memory);
    const scope = { tenant: "acme", owner: "erin", agentId: "main" };
    await memory.addMemories({ scope, memories: [{ text: "Erin's flight leaves at nine" }] });
    const stats = await memory.getMemoryStats({});
    assert.equal(stats.embedder, "openai:scripted-embed:256");
    await stack.kill("model-server", "SIGKILL");
    await assert.rejects(
      memory.addMemories({ scope, memories: [{ text: "this one cannot be embedded" }] }),
      (err: { code: number; details: string }) => {
        assert.equal(err.code, Status.UNAVAILABLE);
        assert.match(err.details, /nothing was stored/);
        return true;
      },
    );
    assert.equal((await memory.getMemoryStats({})).rows, stats.rows);
    memory.close();
  });

  test("a table made by another embedder is refused rather than searched with two kinds of vectors", async () => {
    await stack.kill("memory", "SIGTERM");
    const local = await stack.startInstance("memory-local", "memory", { env: { TROUPE_EMBEDDING_MODEL: "" } }).then(
      () => "started",
      (err: Error) => err.message,
    );
    assert.notEqual(local, "started");
    await waitFor("the refusal in the log", async () =>
      /embedded by openai:scripted-embed:256 and this service embeds with troupe-hash-v1/.test(stack.logs()),
    );
  });
});

describe("the runner's memory tools, and learning from turns", () => {
  let stack: Stack;
  before(async () => {
    stack = await startStack({ services: ["model-server", "router", "memory", "runner", "gateway"] });
  });
  after(async () => {
    await stack?.stop();
  });

  test("memory_save, then the next run recalls it; memory_search finds it; memory_forget removes it", async () => {
    const s = new ChatSession(stack.gateway);
    s.send({ case: "open", value: { sessionId: "mem-tools", create: true } });
    await s.waitOpened();
    const turn = (text: string) => s.turn(text);
    const toolResult = (events: typeof s.events) =>
      events.flatMap((e) => (e.payload.case === "toolExecutionEnd" ? [e.payload.value] : []))[0];
    // Before: recall finds nothing (and believes the scope empty).
    const empty = await turn("!system what colour does Frank like");
    assert.ok(!empty.some((e) => e.payload.case === "messageEnd" && /teal/.test(e.payload.value.message?.text ?? "")));
    const saved = toolResult(
      await turn('!call memory_save {"text": "Frank\'s favourite colour is teal", "evergreen": true}'),
    );
    assert.equal(saved.isError, false, saved.result);
    assert.match(saved.result, /^saved as /);
    // The save cleared the runner's belief that the scope is empty: the very next run recalls it.
    const recalled = await turn("!system what colour does Frank like");
    const prompt = recalled
      .flatMap((e) =>
        e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT
          ? [e.payload.value.message.text]
          : [],
      )
      .join(" ");
    assert.match(prompt, /Frank's favourite colour is teal/);
    const found = toolResult(await turn('!call memory_search {"query": "favourite colour"}'));
    assert.match(found.result, /^(\S+): Frank's favourite colour is teal/);
    const id = /^(\S+):/.exec(found.result)![1];
    const forgot = toolResult(await turn(`!call memory_forget {"id": "${id}"}`));
    assert.equal(forgot.result, `forgot ${id}`);
    const gone = toolResult(await turn('!call memory_search {"query": "favourite colour"}'));
    assert.doesNotMatch(gone.result, /teal/);
    const bad = toolResult(await turn('!call memory_save {"text": ""}'));
    assert.equal(bad.isError, true);
    await s.finish();
  });

  test("facts from a turn are added, then updated, then deleted, each change in the history; the reply never waits", async () => {
    const memory = stack.client(MemoryService, stack.addr.memory);
    const scope = { tenant: "local", owner: "dev" };
    const s = new ChatSession(stack.gateway);
    s.send({ case: "open", value: { sessionId: "learn-1", create: true } });
    await s.waitOpened();
    const turn = (text: string) => s.turn(text);
    const helenCar = async () =>
      texts((await memory.searchMemories({ scope, query: "what car does Helen drive", k: 5 })).results).filter((t) =>
        /Helen's car/.test(t),
      );

    await turn("Remember that Helen's car is a green Volvo. What time is it?");
    await waitFor("the fact to be learned", async () => (await helenCar()).length === 1);
    assert.deepEqual(await helenCar(), ["Helen's car is a green Volvo"]);

    await turn("Remember that Helen's car is a green Volvo.");
    await turn("Remember that Helen's car is a red Tesla now.");
    await waitFor("the update", async () => (await helenCar())[0] === "Helen's car is a red Tesla now");
    assert.equal((await helenCar()).length, 1, "updated in place, not added beside the old one");

    await turn("Forget that Helen's car is a red Tesla now.");
    await waitFor("the deletion", async () => (await helenCar()).length === 0);

    const history = (await memory.getMemoryHistory({ scope })).changes.filter((c) =>
      /Helen's car/.test(c.oldText + c.newText),
    );
    assert.deepEqual(
      history.map((c) => [c.event, c.oldText, c.newText, c.actor]),
      [
        [1, "", "Helen's car is a green Volvo", "learn:learn-1"],
        [2, "Helen's car is a green Volvo", "Helen's car is a red Tesla now", "learn:learn-1"],
        [3, "Helen's car is a red Tesla now", "", "learn:learn-1"],
      ],
      "the repeated fact changed nothing and left no entry",
    );

    // Learning runs after the reply and never holds it up: a memory service that hangs does not.
    process.kill(stack.process("memory")!.pid!, "SIGSTOP");
    try {
      const t0 = Date.now();
      await turn("Remember that Helen likes jazz.");
      assert.ok(Date.now() - t0 < 5000, `the turn ended in ${Date.now() - t0} ms with memory hung`);
    } finally {
      process.kill(stack.process("memory")!.pid!, "SIGCONT");
    }
    await s.finish();
    memory.close();
  });
});
