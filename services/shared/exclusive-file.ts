// Durable, all-or-nothing file writes: session logs, session leases, the internal token, keys and
// schedule files.
import { randomUUID } from "node:crypto";
import { link, open, rename, unlink } from "node:fs/promises";
import path from "node:path";

/**
 * Creates `file` with `content`, or returns false if it exists. The content is written and
 * fsynced to a temporary file first and linked into place, so a reader sees the whole file or
 * none, and a crash leaves at most a `.tmp` file behind (never listed: it is not the name asked for).
 */
export async function createExclusive(file: string, content: string, mode = 0o644): Promise<boolean> {
  const tmp = await writeAside(file, content, mode);
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

/**
 * Replaces `file` with `content` whole: written to a temporary file, fsynced, renamed into place,
 * and the folder fsynced. A reader sees the old file or the new one; a crash leaves one of them.
 */
export async function replaceFile(file: string, content: string, mode = 0o644): Promise<void> {
  const tmp = await writeAside(file, content, mode);
  try {
    await rename(tmp, file);
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
  await syncDir(path.dirname(file));
}

/** `content` in a new temporary file beside `file`, fsynced; returns its name. */
async function writeAside(file: string, content: string, mode: number): Promise<string> {
  const tmp = `${file}.${process.pid}.${randomUUID()}.tmp`;
  const fh = await open(tmp, "wx", mode);
  try {
    await fh.writeFile(content);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return tmp;
}
