// A workspace as one file: `tar` run inside the sandbox, as the sandbox's own user, writes it and
// reads it back. The host never reads an archive's contents; it only stores the bytes a sandbox
// wrote (bounded) and hands them back to a sandbox. Saves and snapshots are both made here, and
// the JSON records beside their archives are read and written here.
import { createReadStream, createWriteStream } from "node:fs";
import { copyFile, readFile, rename, rm, writeFile } from "node:fs/promises";
import type { AgentConnection, AgentExit } from "../agent-connection.js";

const TAR_TIMEOUT_MS = 120_000;
const WINDOW_BYTES = 1 << 20;

/** The largest archive of a workspace of `workspaceBytes`: headers and padding on top of the files, so twice its size. */
export const archiveCap = (workspaceBytes: number): number => 2 * workspaceBytes + (1 << 20);

/** An archive that would pass its bound: nothing was written. */
export class ArchiveTooLarge extends Error {}

/** Runs `command` in the sandbox; its stdout goes to `sink`, stdin comes from `source`. */
function run(
  agent: AgentConnection,
  command: string,
  maxOutputBytes: number,
  sink?: (data: Buffer) => Promise<void>,
  source?: AsyncIterable<Buffer>,
): Promise<{ exit: AgentExit; stderr: string }> {
  return new Promise((resolve, reject) => {
    let stderr = "";
    let writing = Promise.resolve();
    const exec = agent.exec(
      command,
      { timeoutMs: TAR_TIMEOUT_MS, maxOutputBytes, windowBytes: WINDOW_BYTES, openStdin: source !== undefined },
      {
        output: (stream, data) => {
          if (stream === "stderr") stderr = (stderr + data.toString("utf8")).slice(-2000);
          else if (sink) writing = writing.then(() => sink(data)).then(() => exec.credit(data.length));
          if (stream === "stderr") exec.credit(data.length);
        },
        exit: (exit) => void writing.then(() => resolve({ exit, stderr }), reject),
        lost: reject,
      },
    );
    if (source)
      void (async () => {
        for await (const chunk of source) exec.writeStdin(chunk);
        exec.closeStdin();
      })().catch(reject);
  });
}

/**
 * Archives the sandbox's /workspace into `target`, replacing it only once whole; its size in
 * bytes. Over `maxBytes` it is ArchiveTooLarge and `target` is untouched.
 */
export async function archiveWorkspace(agent: AgentConnection, target: string, maxBytes: number): Promise<number> {
  const partial = `${target}.partial`;
  const out = createWriteStream(partial, { mode: 0o600 });
  let bytes = 0;
  try {
    const { exit, stderr } = await run(agent, "tar -cf - .", Math.min(maxBytes, 0xffffffff), async (data) => {
      bytes += data.length;
      if (!out.write(data)) await new Promise<void>((r) => out.once("drain", () => r()));
    });
    await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
    if (exit.truncated) throw new ArchiveTooLarge(`the workspace's archive is over ${maxBytes} bytes`);
    if (exit.exitCode !== 0 || exit.timedOut) throw new Error(`tar ended with ${exit.exitCode}: ${stderr.trim()}`);
    await rename(partial, target);
    return bytes;
  } catch (err) {
    out.destroy();
    await rm(partial, { force: true });
    throw err;
  }
}

/** Unpacks `file` into the sandbox's /workspace. */
export async function unpackWorkspace(agent: AgentConnection, file: string): Promise<void> {
  const { exit, stderr } = await run(agent, "tar -xf -", 64 * 1024, undefined, createReadStream(file));
  if (exit.exitCode !== 0) throw new Error(`tar -x ended with ${exit.exitCode}: ${stderr.trim()}`);
}

/** A JSON record of the store; undefined when it is missing or unreadable (a crash mid-write before records were atomic). */
export async function readRecord<T>(file: string): Promise<T | undefined> {
  const text = await readFile(file, "utf8").catch(() => undefined);
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text) as T;
  } catch {
    return undefined;
  }
}

/** Writes a file of the store whole or not at all (written beside it, then renamed over it). */
export async function writeWhole(file: string, data: string | Uint8Array): Promise<void> {
  await writeFile(`${file}.partial`, data, { mode: 0o600 });
  await rename(`${file}.partial`, file);
}

/** Copies a file of the store whole or not at all, as writeWhole writes. */
export async function copyWhole(source: string, file: string): Promise<void> {
  await copyFile(source, `${file}.partial`);
  await rename(`${file}.partial`, file);
}

/** Writes a JSON record whole or not at all. */
export const writeRecord = (file: string, value: unknown): Promise<void> => writeWhole(file, JSON.stringify(value));
