// Which of V8's compilers a service process runs with. The optimizing tiers (Maglev, TurboFan)
// pay for themselves where JavaScript runs hot: the gateway and the runner on every token, the
// memory service on every search. The router (a placement per session, a route per message) and
// the sandbox (waiting on the Docker engine and its containers) do little work each call, and
// without those tiers their code and the compilers' own pages stay out of memory: 10 to 12 MB a
// process, with no cost measured in their benchmarks (docs/benchmarks.md, footprint).
// TROUPE_JIT=lean also starts the gateway, the runner and the memory service with optimization
// deferred until they are busy (shared/deferred-tiering.ts): smaller idle, and code their start
// also ran stays slower long after. TROUPE_JIT=on gives every service every tier.
// `--one-process` keeps every tier.
import { DEFERRING_FLAGS, thresholdsKnown } from "../shared/deferred-tiering.js";

export type JitChoice = "auto" | "on" | "lean";

/** The services that run on V8's interpreter alone unless TROUPE_JIT=on. */
const INTERPRETED = new Set(["router", "sandbox"]);
/** The services that TROUPE_JIT=lean starts with optimization deferred (deferred-tiering.ts). */
const DEFERRED = new Set(["gateway", "runner", "memory"]);

/**
 * The flags `service`'s Node process starts with for `choice`. Under lean, on a Node whose V8
 * lacks the deferring flags (`v8Knows`), the service starts as under auto, with a warning. A
 * process already started with them (a service after its start over) has its answer and does
 * not ask V8 again: asking runs `node --v8-options`, about 75 ms of a start here.
 */
export function jitFlags(
  service: string,
  choice: JitChoice,
  v8Knows = thresholdsKnown,
  execArgv: readonly string[] = process.execArgv,
): string[] {
  if (choice === "on") return [];
  if (INTERPRETED.has(service)) return ["--max-opt=0"];
  if (choice !== "lean" || !DEFERRED.has(service)) return [];
  if (missingFlags([...DEFERRING_FLAGS], execArgv).length === 0 || v8Knows()) return [...DEFERRING_FLAGS];
  warnOnce(`TROUPE_JIT=lean needs the V8 of Node 24 (this is ${process.version}); ${service} starts as under auto`);
  return [];
}

const warned = new Set<string>();
const warnOnce = (message: string) => {
  if (!warned.has(message)) process.emitWarning(message);
  warned.add(message);
};

/** Those of `wanted` a process started with `execArgv` lacks; a flag set there, to any value, wins. */
export function missingFlags(wanted: string[], execArgv: readonly string[]): string[] {
  const name = (flag: string) => flag.split("=")[0].replace(/_/g, "-");
  return wanted.filter((w) => !execArgv.some((a) => name(a) === name(w)));
}
