// A process that goes quiet keeps the memory it grew while busy. V8 gives back its young
// generation and its pooled pages only at a collection that is asked to reduce memory, and a quiet
// process makes no collection at all, so a service stays at its busiest size while it waits
// (bench/footprint measured 20 to 30 MB per process). Once the event loop has been idle for
// `idleMs`, and the resident set has grown since the last trim, this runs one such collection:
// V8's "last resort" full collection, the one it runs when the system is low on memory.
//
// It never runs under steady work (the loop is not idle), and at most once per quiet period that
// followed growth. Figures: bench/history.md, bench/footprint.
import { performance } from "node:perf_hooks";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

export interface IdleTrimOptions {
  /** How long the event loop must stay idle before a trim; 0 turns trimming off. */
  idleMs: number;
  /** Called after each trim with the resident bytes before and after, and how long it took. */
  onTrim?: (trim: Trim) => void;
  /** How often the event loop is sampled (ms). */
  sampleMs?: number;
  /** A sample counts as idle when the loop was busy for less than this share of it. */
  busyBelow?: number;
  /** A trim is due again only once the resident set has grown this much past the last trim's. */
  minGrowthBytes?: number;
  /** For tests: what is sampled and what a trim runs. */
  utilisation?: () => number;
  residentBytes?: () => number;
  collect?: () => void;
}

export interface Trim {
  beforeBytes: number;
  afterBytes: number;
  ms: number;
}

export interface IdleTrimmer {
  stop(): void;
}

const DEFAULT_SAMPLE_MS = 1000;
const DEFAULT_BUSY_BELOW = 0.02;
const DEFAULT_MIN_GROWTH = 4 * 1024 * 1024;

/** The event loop's busy share since the previous call (performance.eventLoopUtilization). */
function loopUtilisation(): () => number {
  let last = performance.eventLoopUtilization();
  return () => {
    const now = performance.eventLoopUtilization();
    const share = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    return share;
  };
}

let lastResortCollection: (() => void) | undefined;

/**
 * V8's full collection that also shrinks the young generation and returns pooled pages (the one a
 * low-memory notification runs). `gc` is made visible in a fresh context only, so the process's own
 * global object is not changed.
 */
export function collectLastResort(): void {
  if (!lastResortCollection) {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as (options: object) => void;
    lastResortCollection = () => gc({ type: "major", execution: "sync", flavor: "last-resort" });
  }
  lastResortCollection();
}

/** Starts watching the event loop; a trim runs after each quiet period that followed growth. */
export function startIdleTrim(options: IdleTrimOptions): IdleTrimmer {
  if (options.idleMs <= 0) return { stop: () => {} };
  const sampleMs = options.sampleMs ?? DEFAULT_SAMPLE_MS;
  const busyBelow = options.busyBelow ?? DEFAULT_BUSY_BELOW;
  const minGrowth = options.minGrowthBytes ?? DEFAULT_MIN_GROWTH;
  const utilisation = options.utilisation ?? loopUtilisation();
  const residentBytes = options.residentBytes ?? (() => process.memoryUsage.rss());
  const collect = options.collect ?? collectLastResort;

  let quietMs = 0;
  // Nothing trimmed yet: the first quiet period after start trims whatever starting grew.
  let afterLastTrim = 0;
  const timer = setInterval(() => {
    if (utilisation() >= busyBelow) {
      quietMs = 0;
      return;
    }
    quietMs += sampleMs;
    if (quietMs < options.idleMs) return;
    quietMs = 0;
    const beforeBytes = residentBytes();
    if (beforeBytes - afterLastTrim < minGrowth) return;
    const started = performance.now();
    collect();
    afterLastTrim = residentBytes();
    options.onTrim?.({ beforeBytes, afterBytes: afterLastTrim, ms: performance.now() - started });
  }, sampleMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}

const MB = 1024 * 1024;
/** One trim, for a debug log line. */
export const describeTrim = (t: Trim): string =>
  `idle: resident memory ${(t.beforeBytes / MB).toFixed(1)} -> ${(t.afterBytes / MB).toFixed(1)} MB (a full collection, ${t.ms.toFixed(0)} ms)`;
