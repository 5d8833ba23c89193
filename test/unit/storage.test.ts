// The runner's storage contract (test/helpers/storage-contract.ts) on the files of a data
// directory and on the in-memory storage the in-process tier uses.
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { JsonlSessionStore } from "../../services/runner/store/jsonl-session-store.js";
import type { Owner } from "../../services/runner/session/session-lease.js";
import { fileStorage, inMemoryStorage } from "../../services/runner/store/storage.js";
import { orphansContract, storageContract } from "../helpers/storage-contract.js";
import { tempDir } from "../helpers/tempdir.js";

storageContract("files", async (t) =>
  fileStorage(
    await tempDir(t, "troupe-storage-"),
    { runnerId: "r1", address: "", incarnation: randomUUID() },
    10_000,
    () => undefined,
  ),
);
storageContract("in memory", async () => inMemoryStorage());

test("files: a session whose holder is gone is an orphan to every runner", async (t) => {
  const dir = await tempDir(t, "troupe-orphans-");
  const runner = (self: Owner) => {
    const store = new JsonlSessionStore(dir, self, 10_000);
    return { store, start: () => store.start(), kill: () => store.stop() };
  };
  const self = { runnerId: "r1", address: "127.0.0.1:1", incarnation: randomUUID() };
  await orphansContract({
    first: runner(self),
    restarted: runner({ ...self, incarnation: randomUUID() }),
    another: runner({ runnerId: "r2", address: "127.0.0.1:2", incarnation: randomUUID() }),
  });
});
