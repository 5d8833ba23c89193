// The runner's memory recall against a real memory service (LanceDB files, gRPC): scopes found
// empty are not searched again for a while, concurrent first searches ask once, and a memory
// service that is down costs a run its memories, never the run.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { MemoryKind, MemoryService } from "../services/shared/gen/troupe/v1/memory_pb.js";
import { createLogger } from "../services/shared/process/log.js";
import type { createClient } from "../services/shared/rpc.js";
import { MemoryRecall, type MemoryRecallOptions } from "../services/runner/memory/memory-recall.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
let memory: ReturnType<typeof createClient<(typeof MemoryService)["method"]>>;
before(async () => {
  stack = await startStack({ services: ["memory"] });
  memory = stack.client(MemoryService, stack.addr.memory);
});
after(async () => {
  memory?.close();
  await stack?.stop();
});

const signal = new AbortController().signal;
const logger = createLogger("test", "error");
/** A recall with the test's defaults, changed by `o`. */
const recallWith = (o: Partial<MemoryRecallOptions>): MemoryRecall =>
  new MemoryRecall(memory, { k: 5, timeoutMs: 2000, emptyForMs: 60_000, minScore: 0.3, longTermK: 20, ...o }, logger);

test("an empty scope is searched once for a burst of runs, then skipped until its belief expires or is dropped", async () => {
  const recall = recallWith({});
  const scope = { tenant: "t1", owner: "carol", agentId: "main" };
  const burst = await Promise.all(Array.from({ length: 20 }, (_, i) => recall.recall(scope, `question ${i}`, signal)));
  assert.deepEqual(burst.flat(), []);
  assert.equal(recall.skipped, 19, "one search answered the whole burst");

  await memory.addMemories({ scope, memories: [{ text: "Carol keeps bees on her roof" }] });
  // Believed empty: the new memory is not seen yet (the documented staleness) ...
  assert.deepEqual(await recall.recall(scope, "what does Carol keep on her roof", signal), []);
  assert.equal(recall.skipped, 20);
  // ... until the belief is dropped, as a save through this runner does.
  recall.invalidateTenant(scope.tenant);
  assert.deepEqual(
    (await recall.recall(scope, "what does Carol keep on her roof", signal)).map((m) => m.text),
    ["Carol keeps bees on her roof"],
  );
  // A scope with memories is searched every time.
  await recall.recall(scope, "bees", signal);
  assert.equal(recall.skipped, 20);
  // Another scope is its own question.
  assert.deepEqual(await recall.recall({ tenant: "t1", owner: "dave", agentId: "main" }, "bees", signal), []);
  assert.equal(recall.skipped, 20);
});

test("the belief that a scope is empty expires", async () => {
  const recall = recallWith({ emptyForMs: 300 });
  const scope = { tenant: "t1", owner: "erin", agentId: "main" };
  assert.deepEqual(await recall.recall(scope, "anything", signal), []);
  await memory.addMemories({ scope, memories: [{ text: "Erin's flight leaves at nine" }] });
  await new Promise((r) => setTimeout(r, 350));
  assert.deepEqual(
    (await recall.recall(scope, "when does Erin's flight leave", signal)).map((m) => m.text),
    ["Erin's flight leaves at nine"],
  );
});

test("beliefs about empty scopes are bounded: agent ids come from clients", async () => {
  const recall = recallWith({ emptyScopesKept: 20 });
  const scopeOf = (i: number) => ({ tenant: "t2", owner: "fay", agentId: `made-up-${i}` });
  for (let i = 0; i < 60; i++) assert.deepEqual(await recall.recall(scopeOf(i), "anything", signal), []);
  assert.equal(recall.emptyScopes, 20, "the oldest beliefs went");
  // The latest are still held (not searched again); the first was let go (searched again).
  await recall.recall(scopeOf(59), "anything", signal);
  assert.equal(recall.skipped, 1);
  await recall.recall(scopeOf(0), "anything", signal);
  assert.equal(recall.skipped, 1);
  // Beliefs that have run out are swept before live ones are let go.
  const brief = recallWith({ emptyScopesKept: 20, emptyForMs: 50 });
  for (let i = 0; i < 19; i++) await brief.recall(scopeOf(i), "anything", signal);
  await new Promise((r) => setTimeout(r, 80));
  for (let i = 100; i < 102; i++) await brief.recall(scopeOf(i), "anything", signal);
  assert.equal(brief.emptyScopes, 2);
});

test("recall is off with k = 0, and a memory service that is down costs the run only its memories", async () => {
  const off = recallWith({ k: 0 });
  assert.deepEqual(await off.recall({ tenant: "t1", owner: "erin" }, "flight", signal), []);

  const recall = recallWith({ timeoutMs: 300 });
  const scope = { tenant: "t1", owner: "erin", agentId: "main" };
  await stack.kill("memory", "SIGKILL");
  const t0 = Date.now();
  assert.deepEqual(await recall.recall(scope, "when does Erin's flight leave", signal), []);
  assert.ok(Date.now() - t0 < 2000, `gave up within its deadline (${Date.now() - t0} ms)`);
  // A failed search proves nothing about the scope: once memory is back, the next run finds it.
  await stack.start("memory");
  assert.deepEqual(
    (await recall.recall(scope, "when does Erin's flight leave", signal)).map((m) => m.text),
    ["Erin's flight leaves at nine"],
  );
  assert.equal(recall.skipped, 0);
});

test("every long-term fact reaches the run, not only the top k; unrelated episodes do not", async () => {
  const recall = recallWith({ k: 3, emptyForMs: 0 });
  const scope = { tenant: "t1", owner: "erin", agentId: "main" };
  const facts = [
    "Erin is allergic to peanuts",
    "Erin's daughter is called Noor",
    "Erin works night shifts at the hospital",
    "Erin speaks Dutch and Farsi",
    "Erin's car is a green Volvo",
    "Erin plays the cello on Sundays",
    "Erin is vegetarian",
    "Erin moved to Utrecht in 2021",
  ];
  await memory.addMemories({
    scope,
    memories: [
      ...facts.map((text) => ({ text, kind: MemoryKind.FACT })),
      { text: "On Tuesday the printer jammed twice", kind: MemoryKind.EPISODE },
    ],
  });
  const got = await recall.recall(scope, "what should I cook for dinner tonight", signal);
  const texts = got.map((m) => m.text);
  for (const f of facts) assert.ok(texts.includes(f), `${f} missing from ${texts.join(" | ")}`);
  assert.ok(!texts.includes("On Tuesday the printer jammed twice"), texts.join(" | "));
  // The cap holds: no more long-term facts than asked for.
  const capped = recallWith({ k: 1, emptyForMs: 0, longTermK: 4 });
  const few = (await capped.recall(scope, "dinner", signal)).filter((m) => m.kind === MemoryKind.FACT);
  assert.ok(few.length <= 5, `${few.length} facts`);
});

test("long_term_k out of range is refused", async () => {
  const err = await memory.searchMemories({ scope: { tenant: "t1", owner: "erin" }, query: "x", longTermK: 101 }).then(
    () => undefined,
    (e) => e,
  );
  assert.match(String(err?.details ?? err), /long_term_k must be between 0 and 100/);
});
