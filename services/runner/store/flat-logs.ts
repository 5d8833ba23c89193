// The one migration of the file store's layout: logs of the time before sessions were named by
// their owner, moved under their owner's folder when the store starts.
import { mkdir, readFile, readdir, rename, stat, unlink } from "node:fs/promises";
import path from "node:path";
import type { SessionRef } from "../../shared/session-ref.js";

/**
 * Logs written before sessions were named by their owner sat flat in sessions/<id>.jsonl: each
 * moves under its header's owner, once (its lease files are dropped: no runner holds a session
 * while the store starts). A name the new layout already holds is left where it is, and said.
 */
export async function migrateFlatLogs(
  dir: string,
  /** Where the new layout keeps this session's log. */
  fileOf: (ref: SessionRef) => string,
  /** The session a log's first line names, if it is a header. */
  refOfHeader: (line: string) => SessionRef | undefined,
): Promise<void> {
  const names = await readdir(dir).catch(() => [] as string[]);
  for (const name of names) {
    const file = path.join(dir, name);
    if (/\.lease\.\d+$/.test(name)) {
      await unlink(file).catch(() => undefined);
      continue;
    }
    if (!name.endsWith(".jsonl")) continue;
    const text = await readFile(file, "utf8").catch(() => "");
    const ref = refOfHeader(text.split("\n")[0]);
    if (!ref) continue;
    const target = fileOf(ref);
    await mkdir(path.dirname(target), { recursive: true });
    if (
      await stat(target).then(
        () => true,
        () => false,
      )
    )
      continue;
    await rename(file, target);
  }
}
