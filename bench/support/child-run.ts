// One measurement in a process of its own, so its resident memory is its own: runs `script` with
// `args` (and --expose-gc, for a collection before each sample) in a fresh temporary directory,
// passed as --dir and removed afterwards, and returns the JSON the child printed last.
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

export async function runChild<T>(script: string, name: string, args: string[]): Promise<T> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `troupe-${name}-`));
  try {
    const proc = spawn(process.execPath, ["--expose-gc", script, ...args, "--dir", dir], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    proc.stdout.on("data", (c) => (out += c));
    const code = await new Promise((r) => proc.once("exit", r));
    if (code !== 0) throw new Error(`${name}: the child exited with ${code}`);
    return JSON.parse(out.trim().split("\n").at(-1)!) as T;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
