// Which of V8's compilers a service process runs with. The optimizing tiers (Maglev, TurboFan)
// pay for themselves where JavaScript runs hot: the gateway and the runner on every token, the
// memory service on every search. The router (a placement per session, a route per message) does
// little work each call, and without those tiers its code and the compilers' own pages stay out
// of memory: 10 to 12 MB, with no cost measured in its benchmarks (bench/history.md, footprint).
// The sandbox runs every tier but TurboFan: each command crosses its gRPC server and the agent's
// channel, and on the interpreter alone that took twice the CPU and 0.6 to 0.9 ms of a warm
// command (bench/sandbox, docs/settings.md); Maglev costs it 5 MB, TurboFan 4 MB more for nothing
// measured. Deferred as the gateway is, it stayed on the interpreter: a command at a time rarely
// keeps it busy for a second.
// The gateway starts with optimization deferred until it is busy (shared/process/deferred-tiering.ts):
// 9 MB smaller idle, the token path's CPU and bursts the same, its paced p99 within the spread
// of runs without it (bench/history.md, bench/stream). TROUPE_JIT=lean defers the runner and the
// memory service too (2 to 9 MB each) and puts the sandbox back on the interpreter, for a laptop
// or a small VM; it is not the default for them because they are within their budgets without it
// and their first busy seconds compile on the main thread. TROUPE_JIT=on gives every service every
// tier from the start. `--one-process` keeps every tier.
import { DEFERRING_FLAGS } from "../shared/process/deferred-tiering.js";

export type JitChoice = "auto" | "on" | "lean";

/** Ignition alone. */
const INTERPRETER = ["--max-opt=0"];
/** Every tier up to Maglev, no TurboFan. */
const UP_TO_MAGLEV = ["--max-opt=2"];

/** The services that start with fewer than every tier, by choice; the others get every tier. */
const FLAGS: Record<Exclude<JitChoice, "on">, Record<string, readonly string[]>> = {
  auto: { router: INTERPRETER, sandbox: UP_TO_MAGLEV, gateway: DEFERRING_FLAGS },
  lean: {
    router: INTERPRETER,
    sandbox: INTERPRETER,
    gateway: DEFERRING_FLAGS,
    runner: DEFERRING_FLAGS,
    memory: DEFERRING_FLAGS,
  },
};

/** The flags `service`'s Node process starts with for `choice`. */
export function jitFlags(service: string, choice: JitChoice): string[] {
  if (choice === "on") return [];
  return [...(FLAGS[choice][service] ?? [])];
}

/**
 * Those of `wanted` a process started with `execArgv` lacks; a flag set there, to any value or in
 * its `--no-` form, wins.
 */
export function missingFlags(wanted: string[], execArgv: readonly string[]): string[] {
  const name = (flag: string) =>
    flag
      .split("=")[0]
      .replace(/_/g, "-")
      .replace(/^--no-/, "--");
  return wanted.filter((w) => !execArgv.some((a) => name(a) === name(w)));
}
