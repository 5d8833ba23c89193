// Which of V8's compilers a service process runs with. The optimizing tiers (Maglev, TurboFan)
// pay for themselves where JavaScript runs hot: the gateway and the runner on every token, the
// memory service on every search. The router (a placement per session, a route per message) and
// the sandbox (waiting on the Docker engine and its containers) do little work each call, and
// without those tiers their code and the compilers' own pages stay out of memory: 10 to 12 MB a
// process, with no cost measured in their benchmarks (bench/history.md, footprint).
// The gateway starts with optimization deferred until it is busy (shared/process/deferred-tiering.ts):
// 9 MB smaller idle, the token path's CPU and bursts the same, its paced p99 within the spread
// of runs without it (bench/history.md, bench/stream). TROUPE_JIT=lean defers the
// runner and the memory service too (2 to 9 MB each), for a laptop or a small VM; it is not the
// default for them because they are within their budgets without it and their first busy
// seconds compile on the main thread. TROUPE_JIT=on gives every service every tier from the
// start. `--one-process` keeps every tier.
import { DEFERRING_FLAGS } from "../shared/process/deferred-tiering.js";

export type JitChoice = "auto" | "on" | "lean";

/** The services that run on V8's interpreter alone unless TROUPE_JIT=on. */
const INTERPRETED = new Set(["router", "sandbox"]);
/** The services that start with optimization deferred, by choice (deferred-tiering.ts). */
const DEFERRED: Record<Exclude<JitChoice, "on">, ReadonlySet<string>> = {
  auto: new Set(["gateway"]),
  lean: new Set(["gateway", "runner", "memory"]),
};

/** The flags `service`'s Node process starts with for `choice`. */
export function jitFlags(service: string, choice: JitChoice): string[] {
  if (choice === "on") return [];
  if (INTERPRETED.has(service)) return ["--max-opt=0"];
  return DEFERRED[choice].has(service) ? [...DEFERRING_FLAGS] : [];
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
