// The runner's storage contract (test/helpers/storage-contract.ts) on the files of a data
// directory and on the in-memory storage the in-process tier uses.
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { JsonlSessionStore } from "../../services/runner/jsonl-session-store.js";
import { fileStorage, inMemoryStorage } from "../../services/runner/storage.js";
import { leftHereContract, storageContract } from "../helpers/storage-contract.js";
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

test("files: what an earlier process of this runner left open is found by the next one", async (t) => {
  const dir = await tempDir(t, "troupe-left-");
  const self = { runnerId: "r1", address: "127.0.0.1:1", incarnation: randomUUID() };
  await leftHereContract({
    first: new JsonlSessionStore(dir, self),
    restarted: new JsonlSessionStore(dir, { ...self, incarnation: randomUUID() }),
    another: new JsonlSessionStore(dir, { runnerId: "r2", address: "127.0.0.1:2", incarnation: randomUUID() }),
  });
});
