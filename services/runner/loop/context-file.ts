// Reading one operator file for a prompt (an AGENTS.md, a skill, a USER.md): bounded, as text or
// not at all, with the reason when it is used in part or left out. The prompt's sources
// (context.ts) and the profile stores read every file through here.
import { isUtf8 } from "node:buffer";
import { open, stat } from "node:fs/promises";
import path from "node:path";

/** Bytes read from any context file; more than this is never needed. */
const READ_BYTES = 64 * 1024;

export interface FileRead {
  file: string;
  text: string;
  /** Why the file was used in part or not at all. */
  problem?: string;
}

/** A text file, cut at `limit` characters; binary files are refused with a stated problem. */
export async function readContextFile(file: string, limit: number): Promise<FileRead | undefined> {
  let size: number;
  try {
    const st = await stat(file);
    if (!st.isFile()) return undefined;
    size = st.size;
  } catch {
    return undefined;
  }
  const handle = await open(file, "r").catch(() => undefined);
  if (!handle) return { file, text: "", problem: `${path.basename(file)} cannot be read` };
  try {
    const buf = Buffer.alloc(Math.min(size, READ_BYTES));
    const { bytesRead } = await handle.read(buf, 0, buf.length, 0);
    let bytes = buf.subarray(0, bytesRead);
    // A read cut short may end inside a character: up to 3 trailing bytes of one are not a defect.
    if (bytesRead < size) for (let k = 0; k < 3 && !isUtf8(bytes); k++) bytes = bytes.subarray(0, bytes.length - 1);
    if (bytes.includes(0) || !isUtf8(bytes)) {
      return { file, text: "", problem: `${path.basename(file)} is not a UTF-8 text file; it was left out` };
    }
    const text = bytes.toString("utf8");
    if (bytesRead < size) {
      // Only the start was read: the file's length is known in bytes, not characters.
      return {
        file,
        text: text.slice(0, limit),
        problem: `${path.basename(file)} is ${size} bytes; only the first ${limit} characters are used`,
      };
    }
    if (text.length > limit) {
      return {
        file,
        text: text.slice(0, limit),
        problem: `${path.basename(file)} has ${text.length} characters; only the first ${limit} are used`,
      };
    }
    return { file, text };
  } finally {
    await handle.close();
  }
}
