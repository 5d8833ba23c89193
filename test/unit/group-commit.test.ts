// The group commit's queueing, against an in-memory writer chain: who goes in which commit, what
// a failed commit does to its group and to the next, and a retried turn.
import { test } from "node:test";
import assert from "node:assert/strict";
import { GroupCommit, type Settled } from "../../services/memory/group-commit.js";

/** A writer that runs turns one after another (retrying each up to `retries` times), as MemoryTable.write does. */
function writer(retries = 0) {
  let chain: Promise<unknown> = Promise.resolve();
  return (turn: () => Promise<void>) => {
    const attempt = async () => {
      for (let i = 0; ; i++) {
        try {
          return await turn();
        } catch (err) {
          if (i >= retries) throw err;
        }
      }
    };
    const next = chain.then(attempt, attempt);
    chain = next.catch(() => undefined);
    return next;
  };
}

test("a lone request commits at once; those arriving meanwhile go together, up to the limit", async () => {
  const groups: number[][] = [];
  let release!: () => void;
  const firstHeld = new Promise<void>((r) => (release = r));
  const gc = new GroupCommit<number, number>(
    async (group) => {
      groups.push(group);
      if (groups.length === 1) await firstHeld;
      return group.map((n) => ({ ok: n * 10 }));
    },
    writer(),
    3,
  );
  const first = gc.submit(1);
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(groups, [[1]], "the first request did not wait for company");
  const rest = [2, 3, 4, 5, 6].map((n) => gc.submit(n));
  release();
  assert.deepEqual(await Promise.all([first, ...rest]), [10, 20, 30, 40, 50, 60]);
  assert.deepEqual(groups, [[1], [2, 3, 4], [5, 6]]);
});

test("a caller's own refusal fails it alone; a failed commit fails its group, and the next group goes on", async () => {
  let calls = 0;
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const gc = new GroupCommit<string, string>(
    async (group): Promise<Settled<string>[]> => {
      calls++;
      if (calls === 1) await held;
      if (group.includes("boom")) throw new Error("commit failed");
      return group.map((s) => (s === "bad" ? { error: new Error(`refused ${s}`) } : { ok: s.toUpperCase() }));
    },
    writer(),
    64,
  );
  const lone = gc.submit("a");
  const second = [gc.submit("b"), gc.submit("bad")];
  release();
  assert.equal(await lone, "A");
  const [b, bad] = await Promise.allSettled(second);
  assert.deepEqual(b, { status: "fulfilled", value: "B" });
  assert.equal(bad.status, "rejected");
  assert.match(String((bad as PromiseRejectedResult).reason), /refused bad/);
  const failed = await Promise.allSettled([gc.submit("boom")]);
  assert.match(String((failed[0] as PromiseRejectedResult).reason), /commit failed/);
  assert.equal(await gc.submit("after"), "AFTER", "the writer serves on after a failed commit");
});

test("a retried turn commits the same group, and requests arriving during it wait for the next", async () => {
  const seen: string[][] = [];
  let late: Promise<string> | undefined;
  const gc = new GroupCommit<string, string>(
    async (group) => {
      seen.push([...group]);
      if (seen.length === 1) {
        late = gc.submit("late");
        throw Object.assign(new Error("conflict"), { retry: true });
      }
      return group.map((s) => ({ ok: s }));
    },
    // A writer that retries a turn once when it throws, as retryConflicts does.
    writer(1),
    64,
  );
  assert.equal(await gc.submit("x"), "x");
  assert.equal(await late, "late");
  assert.deepEqual(seen, [["x"], ["x"], ["late"]]);
});
