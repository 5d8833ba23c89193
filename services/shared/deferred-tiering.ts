// TROUPE_JIT=lean: a smaller idle process, paid for in speed once busy. V8 optimizes a function
// once it has run a few hundred times (Maglev after 400 calls, TurboFan after 3,000). A service's
// start runs some code that often and never again: Node's module resolver normalizes paths tens of
// thousands of times, protobuf-es decodes its descriptors. Optimizing it pages in the compilers'
// own code, several MB of the node binary that then stay resident. Under lean the gateway, the
// runner and the memory service start with the thresholds raised past what a start reaches
// (jit.ts), and V8's own come back at the first second in which the event loop is busy a quarter
// of the time. Idle after start and a tool turn: gateway 68 to 69 MB instead of 77 to 78
// (docs/benchmarks.md, bench/footprint). The price, and why it is not the default: code the
// start also ran keeps the raised count until it runs that often again, hours away at a few
// calls a second. The per-session paths are such code: with the gateway deferred, bench/stream's
// bursts right after start carried less, and its paced p99 (1,000 sessions starting at once)
// measured 753 and 835 ms against 496 and 488 without, alternated (a third run without: 760).
import { spawnSync } from "node:child_process";
import { performance } from "node:perf_hooks";
import { setFlagsFromString } from "node:v8";

interface Threshold {
  flag: string;
  /** While the process starts: past anything a start reaches (measured with --trace-opt), and
   * small enough that V8's budget (calls times bytecode length, an int32) does not overflow. */
  starting: number;
  /** V8's own default (Node 24's V8; a unit test checks them against `node --v8-options`). */
  usual: number;
}

export const THRESHOLDS: readonly Threshold[] = [
  { flag: "--invocation-count-for-maglev", starting: 100_000, usual: 400 },
  { flag: "--invocation-count-for-maglev-osr", starting: 100_000, usual: 100 },
  { flag: "--invocation-count-for-turbofan", starting: 100_000, usual: 3_000 },
  { flag: "--invocation-count-for-osr", starting: 100_000, usual: 500 },
  { flag: "--minimum-invocations-after-ic-update", starting: 100_000, usual: 500 },
];

/** The Node flags a service starts with to defer optimization (jit.ts). */
export const DEFERRING_FLAGS: readonly string[] = THRESHOLDS.map((t) => `${t.flag}=${t.starting}`);

const known = new Map<string, boolean>();

/**
 * Whether the V8 of the Node at `execPath` has every threshold flag, with the default put back
 * here. Node 22's V8 lacks some (Troupe runs on Node 22.19 and later), and a Node refuses to start
 * with a flag it does not know; there, lean starts services as auto does. Asked once per path.
 */
export function thresholdsKnown(execPath = process.execPath): boolean {
  let answer = known.get(execPath);
  if (answer === undefined) {
    const options = spawnSync(execPath, ["--v8-options"], { encoding: "utf8", timeout: 10_000 }).stdout ?? "";
    answer = THRESHOLDS.every((t) => options.includes(`default: ${t.flag}=${t.usual}\n`));
    known.set(execPath, answer);
  }
  return answer;
}

/**
 * The share of a second the event loop must be busy for the process to count as busy. The
 * gateway's busiest second of start and one tool turn measured 0.05 (bench/footprint); a burst
 * keeps it above 0.5.
 */
export const BUSY_SHARE = 0.25;
const SAMPLE_MS = 1000;

/**
 * Puts V8's thresholds back at the first second after this call (the service listens) in which
 * the event loop is busy `busyShare` of the time, checked on a timer that keeps no process alive.
 * Only the flags this process started with at the deferring values are put back: an operator's
 * own win. Returns a stop function; `onResume` is told the busy share that did it.
 */
export function resumeOptimizationOnceBusy(
  onResume: (share: number) => void,
  execArgv: readonly string[] = process.execArgv,
  busyShare = BUSY_SHARE,
): () => void {
  const deferred = THRESHOLDS.filter((t) => execArgv.includes(`${t.flag}=${t.starting}`));
  if (deferred.length === 0) return () => {};
  let last = performance.eventLoopUtilization();
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    const share = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    if (share < busyShare) return;
    clearInterval(timer);
    setFlagsFromString(deferred.map((t) => `${t.flag}=${t.usual}`).join(" "));
    onResume(share);
  }, SAMPLE_MS);
  timer.unref();
  return () => clearInterval(timer);
}
