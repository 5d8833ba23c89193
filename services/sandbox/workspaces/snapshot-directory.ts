// Snapshots in a directory (the default: the data directory's snapshots/): `<folder>/<id>.tar`
// with `<id>.json` beside it. An archive is written beside its final name and renamed into it;
// what a crash leaves of one is swept at the next start.
import { mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { readRecord, writeRecord } from "./workspace-archive.js";
import { STALE_MS, type SnapshotStore, type StoreContext } from "./snapshot-store.js";

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
    // A crash between staging and rename leaves `<id>.tar.partial`; one between the archive and
    // its record, `<id>.tar` alone. Neither is listed or counted, so neither would ever go.
    async sweep() {
      const before = Date.now() - STALE_MS;
      let removed = 0;
      for (const folder of await readdir(dir).catch(() => [] as string[])) {
        const files = await readdir(at(folder)).catch(() => [] as string[]);
        const records = new Set(files.filter((f) => f.endsWith(".json")).map((f) => f.slice(0, -".json".length)));
        for (const f of files) {
          const orphan = f.endsWith(".tar") && !records.has(f.slice(0, -".tar".length));
          if (!orphan && !f.endsWith(".partial")) continue;
          const file = path.join(at(folder), f);
          const mtime = (await stat(file).catch(() => undefined))?.mtimeMs ?? Number.POSITIVE_INFINITY;
          if (mtime >= before) continue;
          await rm(file, { force: true });
          removed++;
        }
      }
      return removed;
    },
  };
}
