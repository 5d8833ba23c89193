// A channel adapter (`troupe adapter KIND`) as its own process, for tests that kill and restart it.
import { spawn, type ChildProcess } from "node:child_process";
import { MAIN, waitFor } from "./stack.js";

export interface AdapterProcess {
  proc: ChildProcess;
  /** What it wrote to stderr. */
  output(): string;
  kill(signal: NodeJS.Signals): Promise<number | null>;
}

/** Starts `troupe adapter KIND [args]` with `env` added, and waits until it logs `ready`. */
export async function startAdapter(
  kind: string,
  env: NodeJS.ProcessEnv,
  ready: RegExp,
  args: string[] = [],
): Promise<AdapterProcess> {
  const proc = spawn(process.execPath, [MAIN, "adapter", kind, ...args], {
    env: { ...process.env, TROUPE_LOG_FORMAT: "json", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  proc.stdout!.on("data", (c: Buffer) => (output += c.toString()));
  proc.stderr!.on("data", (c: Buffer) => (output += c.toString()));
  const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
  await waitFor(`adapter ${kind} ready`, async () => proc.exitCode !== null || ready.test(output));
  if (proc.exitCode !== null) throw new Error(`adapter ${kind} exited ${proc.exitCode}: ${output}`);
  return {
    proc,
    output: () => output,
    async kill(signal) {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}
