// The runner's storage contract (test/helpers/storage-contract.ts) on the files of a data
// directory and on the in-memory storage the in-process tier uses.
import { randomUUID } from "node:crypto";
import { fileStorage, inMemoryStorage } from "../../services/runner/storage.js";
import { storageContract } from "../helpers/storage-contract.js";
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
