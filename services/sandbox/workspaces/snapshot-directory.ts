// Snapshots in a directory (the default: the data directory's snapshots/): `<folder>/<id>.tar`
// with `<id>.json` beside it. An archive is written beside its final name and renamed into it.
import { mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { readRecord, writeRecord } from "./workspace-archive.js";
import type { SnapshotStore, StoreContext } from "./snapshot-store.js";

export function directoryStore(dir: string, _ctx: StoreContext): SnapshotStore {
  const at = (name: string) => path.join(dir, name);
  const folderOf = async (name: string) => {
    await mkdir(path.dirname(at(name)), { recursive: true, mode: 0o700 });
    return at(name);
  };
  const recordsIn = async (folder: string) =>
    (await readdir(at(folder)).catch(() => [] as string[]))
      .filter((n) => n.endsWith(".json"))
      .map((n) => `${folder}/${n.slice(0, -".json".length)}`);
  return {
    where: dir,
    staging: async (name) => `${await folderOf(name)}.tar.partial`,
    putArchive: (name, staged) => rename(staged, `${at(name)}.tar`),
    archive: (name) =>
      stat(`${at(name)}.tar`).then(
        () => `${at(name)}.tar`,
        () => undefined,
      ),
    putRecord: async (name, value) => writeRecord(`${await folderOf(name)}.json`, value),
    readRecord: (name) => readRecord(`${at(name)}.json`),
    async names(folder) {
      if (folder !== undefined) return recordsIn(folder);
      const folders = await readdir(dir).catch(() => [] as string[]);
      return (await Promise.all(folders.map(recordsIn))).flat();
    },
    async remove(name) {
      await rm(`${at(name)}.json`, { force: true });
      await rm(`${at(name)}.tar`, { force: true });
    },
  };
}
