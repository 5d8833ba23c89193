// Durable, all-or-nothing file creation: session logs, session leases, the internal token.
import { randomUUID } from "node:crypto";
import { link, open, unlink } from "node:fs/promises";

/**
 * Creates `file` with `content`, or returns false if it exists. The content is written and
 * fsynced to a temporary file first and linked into place, so a reader sees the whole file or
 * none, and a crash leaves at most a `.tmp` file behind (never listed: it is not the name asked for).
 */
export async function createExclusive(file: string, content: string, mode = 0o644): Promise<boolean> {
  const tmp = `${file}.${process.pid}.${randomUUID()}.tmp`;
  const fh = await open(tmp, "wx", mode);
  try {
    await fh.writeFile(content);
    await fh.datasync();
  } finally {
    await fh.close();
  }
  try {
    await link(tmp, file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw err;
  } finally {
    await unlink(tmp).catch(() => undefined);
  }
}

/** Makes a directory's entries (a newly linked file) durable. */
export async function syncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
