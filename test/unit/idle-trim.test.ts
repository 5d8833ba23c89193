// A quiet process gives back what it grew: one collection after an idle period that followed
// growth, none while busy, none again until it grew. The event loop's load and the resident size
// are injected (real timers); the last test runs V8's real collection.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { getHeapSpaceStatistics } from "node:v8";
import { collectLastResort, startIdleTrim, type Trim } from "../../services/shared/process/idle-trim.js";

const MB = 1024 * 1024;

/** A process whose load and size the test sets, and the trims it got. */
function scriptedProcess() {
  const state = { load: 0, rss: 100 * MB, collections: 0, trims: [] as Trim[] };
  const trimmer = (idleMs: number) =>
    startIdleTrim({
      idleMs,
      sampleMs: 10,
      utilisation: () => state.load,
      residentBytes: () => state.rss,
      collect: () => {
        state.collections++;
        state.rss -= 20 * MB;
      },
      onTrim: (t) => state.trims.push(t),
    });
  return { state, trimmer };
}

describe("startIdleTrim", () => {
  test("trims once after the loop has been idle for idleMs, and reports the sizes", async () => {
    const { state, trimmer } = scriptedProcess();
    const t = trimmer(50);
    await sleep(30);
    assert.equal(state.collections, 0, "not before idleMs");
    await sleep(120);
    t.stop();
    assert.equal(state.collections, 1);
    assert.equal(state.trims[0].beforeBytes, 100 * MB);
    assert.equal(state.trims[0].afterBytes, 80 * MB);
  });

  test("a busy loop never trims, and busy samples restart the idle period", async () => {
    const { state, trimmer } = scriptedProcess();
    state.load = 0.5;
    const t = trimmer(50);
    await sleep(150);
    assert.equal(state.collections, 0, "busy: no trim");
    // Idle for less than idleMs at a time, then busy again: still none.
    for (let i = 0; i < 4; i++) {
      state.load = 0;
      await sleep(25);
      state.load = 0.5;
      await sleep(25);
    }
    assert.equal(state.collections, 0, "short idle spells do not add up");
    state.load = 0;
    await sleep(120);
    t.stop();
    assert.equal(state.collections, 1);
  });

  test("no second trim until the process has grown again by minGrowthBytes", async () => {
    const { state, trimmer } = scriptedProcess();
    const t = trimmer(30);
    await sleep(80);
    assert.equal(state.collections, 1);
    // A spell of work that grew little, then quiet: nothing to give back.
    state.load = 0.5;
    await sleep(25);
    state.rss += 1 * MB;
    state.load = 0;
    await sleep(100);
    assert.equal(state.collections, 1, "grew 1 MB: no trim");
    state.rss += 10 * MB;
    await sleep(100);
    t.stop();
    assert.equal(state.collections, 2, "grew 11 MB: trimmed again");
  });

  test("idleMs 0 turns it off, and stop ends the sampling", async () => {
    const { state, trimmer } = scriptedProcess();
    trimmer(0);
    const stopped = trimmer(30);
    stopped.stop();
    await sleep(100);
    assert.equal(state.collections, 0);
  });

  test("the real collection shrinks V8's young generation and leaves the global object alone", () => {
    const hadGc = "gc" in globalThis;
    const newSpace = () => getHeapSpaceStatistics().find((s) => s.space_name === "new_space")!.space_size;
    // Grow the young generation: objects that survive a few scavenges make V8 enlarge it.
    const keep: unknown[][] = [];
    for (let round = 0; round < 40; round++) {
      keep.push(Array.from({ length: 20_000 }, (_, i) => ({ i, s: `item ${i}` })));
      if (keep.length > 8) keep.shift();
    }
    const grown = newSpace();
    keep.length = 0;
    const rssBefore = process.memoryUsage.rss();
    collectLastResort();
    const after = newSpace();
    const given = rssBefore - process.memoryUsage.rss();
    assert.ok(grown > 8 * MB, `the young generation grew (${grown} bytes)`);
    assert.ok(after < grown / 2, `shrunk from ${grown} to ${after} bytes`);
    // An ordinary full collection empties the space but keeps its pages; this one unmaps them.
    assert.ok(given > grown / 4, `gave back ${given} bytes of resident memory`);
    assert.equal("gc" in globalThis, hadGc, "no gc function left on the global object");
  });
});
