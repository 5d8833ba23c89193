// The runner's storage contract, one suite for every implementation (files, in memory, and
// PostgreSQL in test/pg-store.test.ts): sessions are named by their owner, schedules and profiles
// are kept per owner, a stranger's object and a missing one look the same.
import { describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import type { SessionStore } from "../../services/runner/session/session-log.js";
import type { RunnerStorage } from "../../services/runner/store/storage.js";
import { refOf } from "../../services/shared/session-ref.js";

const ALICE = { tenant: "t1", principal: "alice" };
const MALLORY = { tenant: "t2", principal: "alice" };

/** Runs the contract on storages that `make` gives (a new, empty one per test). */
export function storageContract(kind: string, make: (t: TestContext) => Promise<RunnerStorage>): void {
  describe(`runner storage (${kind})`, () => {
    test("a session belongs to its owner: the same id under another tenant is another session", async (t) => {
      const storage = await make(t);
      await storage.start();
      t.after(() => storage.stop());
      const log = await storage.sessions.create(refOf(ALICE, "s1"), "main", ALICE);
      await log.append({ t: "settings", queueMode: 2 }, true);
      await log.close();
      assert.equal(await storage.sessions.exists(refOf(ALICE, "s1")), true);
      assert.equal(await storage.sessions.exists(refOf(MALLORY, "s1")), false);
      assert.deepEqual(await storage.sessions.list(MALLORY), []);
      assert.deepEqual(
        (await storage.sessions.list(ALICE)).map((s) => s.sessionId),
        ["s1"],
      );
      const records = await storage.sessions.read(refOf(ALICE, "s1"));
      assert.deepEqual(records.at(-1), { t: "settings", queueMode: 2 });
    });

    test("a sub-agent's session is listed with its parent, whatever the length of its instruction", async (t) => {
      const storage = await make(t);
      await storage.start();
      t.after(() => storage.stop());
      await (await storage.sessions.create(refOf(ALICE, "p1"), "main", ALICE)).close();
      // The longest instruction delegate_task allows, in three-byte characters: a header of ~48 KB.
      const instruction = "数".repeat(16_000);
      const child = refOf(ALICE, "p1:sub:abc");
      await (
        await storage.sessions.create(child, "main", ALICE, { parentSessionId: "p1", depth: 1, instruction })
      ).close();
      const listed = (await storage.sessions.list(ALICE)).sort((a, b) => a.sessionId.localeCompare(b.sessionId));
      assert.deepEqual(
        listed.map((s) => [s.sessionId, s.parentSessionId]),
        [
          ["p1", undefined],
          ["p1:sub:abc", "p1"],
        ],
      );
      assert.deepEqual((await storage.sessions.list()).length, 2, "and in the listing of everyone's");
      // Times become protobuf Timestamps (ListSessions): whole milliseconds, or the encoding fails.
      for (const s of listed) assert.ok(Number.isInteger(s.createdMs) && Number.isInteger(s.updateMs), s.sessionId);
    });

    test("a removed session is gone for good: its id may be made again, empty; a stranger's is not touched", async (t) => {
      const storage = await make(t);
      await storage.start();
      t.after(() => storage.stop());
      for (const owner of [ALICE, MALLORY]) {
        const log = await storage.sessions.create(refOf(owner, "s1"), "main", owner);
        await log.append({ t: "settings", queueMode: 2 }, true);
        await log.close();
      }
      assert.equal(await storage.sessions.remove(refOf(ALICE, "s1")), true);
      assert.equal(await storage.sessions.remove(refOf(ALICE, "s1")), false, "once");
      assert.equal(await storage.sessions.exists(refOf(ALICE, "s1")), false);
      assert.equal(await storage.sessions.exists(refOf(MALLORY, "s1")), true);
      const again = await storage.sessions.create(refOf(ALICE, "s1"), "main", ALICE);
      await again.close();
      const records = await storage.sessions.read(refOf(ALICE, "s1"));
      assert.ok(!records.some((r) => r.t === "settings"), "nothing of the old session");
      const { log } = await storage.sessions.activate(refOf(ALICE, "s1"));
      await log.close();
    });

    test("schedules are kept whole per session and owner, and removed whole", async (t) => {
      const storage = await make(t);
      await storage.start();
      t.after(() => storage.stop());
      const ref = refOf(ALICE, "s1");
      const file = {
        sessionId: "s1",
        ...ALICE,
        schedules: [{ scheduleId: "h1", everySeconds: 60, text: "check in", createdMs: 1 }],
      };
      await storage.schedules.write(ref, file);
      assert.deepEqual(await storage.schedules.read(ref), file);
      assert.equal(await storage.schedules.read(refOf(MALLORY, "s1")), undefined, "a stranger's looks missing");
      assert.equal((await storage.schedules.all()).length, 1);
      await storage.schedules.write(ref, undefined);
      assert.equal(await storage.schedules.read(ref), undefined);
      assert.deepEqual(await storage.schedules.all(), []);
    });

    test("a profile is made once from the template, per agent and owner, and read cut to the limit", async (t) => {
      const storage = await make(t);
      await storage.start();
      t.after(() => storage.stop());
      const owner = { agentId: "main", ...ALICE };
      const first = await storage.profiles.read(owner, "# USER\n", 1000);
      assert.equal(first?.text, "# USER\n");
      const again = await storage.profiles.read(owner, "another template", 1000);
      assert.equal(again?.text, "# USER\n", "made once: a later template does not replace it");
      const stranger = await storage.profiles.read({ agentId: "main", ...MALLORY }, "theirs", 1000);
      assert.equal(stranger?.text, "theirs", "another tenant's principal of the same name has their own");
      const cut = await storage.profiles.read({ agentId: "other", ...ALICE }, "x".repeat(50), 10);
      assert.equal(cut?.text, "x".repeat(10));
      assert.match(cut?.problem ?? "", /50 characters; only the first 10 are used/);
    });

    test("the audit log reads back newest first, by tenant and by session", async (t) => {
      const storage = await make(t);
      await storage.start();
      t.after(() => storage.stop());
      const abort = (tenant: string, sessionId: string, frameId: string) =>
        storage.audit.record({
          action: "abort",
          sessionId,
          tenant,
          frameId,
          reason: "",
          turnId: "",
          clearQueue: false,
        });
      await abort("t1", "s1", "f1");
      await abort("t2", "s1", "f2");
      await abort("t1", "s2", "f3");
      const frames = async (q: { limit: number; tenant?: string; sessionId?: string }) =>
        (await storage.audit.read(q)).map((a) => (a.record as { frameId: string }).frameId);
      assert.deepEqual(await frames({ limit: 10 }), ["f3", "f2", "f1"]);
      assert.deepEqual(await frames({ limit: 2 }), ["f3", "f2"]);
      assert.deepEqual(await frames({ limit: 10, tenant: "t1" }), ["f3", "f1"]);
      assert.deepEqual(await frames({ limit: 10, tenant: "t1", sessionId: "s1" }), ["f1"]);
      assert.deepEqual(await frames({ limit: 10, tenant: "t3" }), []);
      const [newest] = await storage.audit.read({ limit: 1 });
      assert.ok(Math.abs(newest.timeMs - Date.now()) < 60_000);
    });
  });
}

/** A runner process over a shared storage, for orphansContract: its store, its heartbeat's start, and its death. */
export interface ContractRunner {
  store: SessionStore;
  start(): Promise<void>;
  /** Its heartbeat stops and it closes nothing, as a SIGKILL leaves things. */
  kill(): Promise<void>;
}

/**
 * orphans, on runners that share one storage: `first` and `restarted` are two processes of one
 * runner (same id and address, the second a new incarnation), `another` is another runner. A
 * session is an orphan once its holder is gone, to every runner (also one its holder closed
 * keeping the lease); what a live runner holds, or what nobody holds (closed), is not; nor is a
 * session whose log says it owes nothing (settled, then only seq and epoch records).
 */
export async function orphansContract(runners: {
  first: ContractRunner;
  restarted: ContractRunner;
  another: ContractRunner;
}): Promise<void> {
  const { first, restarted, another } = runners;
  const sorted = async (r: ContractRunner) =>
    (await r.store.orphans()).map((x) => `${x.tenant}/${x.principal}/${x.sessionId}`).sort();
  await first.start();
  await another.start();
  // The same session id under two owners: two sessions, each found as its own.
  for (const owner of [ALICE, MALLORY]) await first.store.create(refOf(owner, "s-open"), "main", owner);
  await (await first.store.create(refOf(ALICE, "s-closed"), "main", ALICE)).close();
  // Closed keeping its lease (a run handed over at a shutdown): still held while its process lives.
  await (await first.store.create(refOf(ALICE, "s-kept"), "main", ALICE)).close({ keepLease: true });
  await another.store.create(refOf(ALICE, "s-other"), "main", ALICE);
  const settled = await first.store.create(refOf(ALICE, "s-settled"), "main", ALICE);
  await settled.append({ t: "settled" });
  await settled.append({ t: "seq", upTo: 500 }, true);
  const owing = await first.store.create(refOf(ALICE, "s-owing"), "main", ALICE);
  await owing.append({ t: "settled" });
  await owing.append({ t: "frame", frame: {} }, true);
  assert.deepEqual(await sorted(another), [], "a live runner's sessions are not orphans");
  assert.deepEqual(await sorted(first), [], "nor one's own");

  await first.kill();
  await restarted.start();
  const left = ["t1/alice/s-kept", "t1/alice/s-open", "t1/alice/s-owing", "t2/alice/s-open"];
  assert.deepEqual(await sorted(restarted), left, "what the killed process held, found by its successor");
  assert.deepEqual(await sorted(another), left, "and by any other runner");
  // Taken back, a session is no longer an orphan; closed, it is nobody's.
  const { log } = await restarted.store.activate(refOf(ALICE, "s-open"));
  await (await restarted.store.activate(refOf(ALICE, "s-kept"))).log.close();
  assert.deepEqual(await sorted(another), ["t1/alice/s-owing", "t2/alice/s-open"]);
  await log.close();
  assert.deepEqual(await sorted(another), ["t1/alice/s-owing", "t2/alice/s-open"]);
  // Taken over and left again without work, a settled session stays settled.
  await (await another.store.activate(refOf(ALICE, "s-settled"))).log.close({ keepLease: true });
  assert.deepEqual(await sorted(restarted), ["t1/alice/s-owing", "t2/alice/s-open"]);

  await another.kill();
  assert.deepEqual(
    await sorted(restarted),
    ["t1/alice/s-other", "t1/alice/s-owing", "t2/alice/s-open"],
    "another runner's, once it died",
  );
}
