// Optimization deferred until a service is busy: a smaller idle process at no measured cost once
// busy. V8 optimizes a function once it has run a few hundred times (Maglev after 400 calls,
// TurboFan after 3,000). A service's start runs some code that often and never again: Node's
// module resolver normalizes paths tens of thousands of times, protobuf-es decodes its
// descriptors. Optimizing it pages in the compilers' own code, several MB of the node binary that
// then stay resident. So a deferred service (jit.ts) starts with both optimizing compilers off
// (Ignition and Sparkplug only), and they are turned on at the first second in which its event
// loop is busy a quarter of the time. Idle after start and a tool turn the gateway measures 68.8 MB
// instead of 77 to 78 (bench/history.md, bench/footprint).
//
// Why the compilers are switched and not their thresholds raised (stop 54's first lean): V8 sets
// a function's next tier-up check from the thresholds in force when it last set it, so code the
// start ran kept a 100,000-call budget long after the thresholds came back, the per-session paths
// among it (paced p99 753 and 835 ms against 496 and 488). With the compilers off V8 keeps setting
// ordinary budgets and only declines to optimize; once they are on, the next check optimizes.
// The price: Maglev's background thread is set up only when Maglev is on at start, so a deferred
// process compiles Maglev code on its main thread (0.5 ms for a small function here); TurboFan
// still compiles in the background. Node 20's V8 and later have both flags.
import { performance } from "node:perf_hooks";
import { setFlagsFromString } from "node:v8";

/** The Node flags a deferred service starts with; each is undone by its `--` form on resume. */
export const DEFERRING_FLAGS: readonly string[] = ["--no-maglev", "--no-turbofan"];

/**
 * The share of a second the event loop must be busy for the process to count as busy. The
 * gateway's busiest second of start and one tool turn measured 0.05 (bench/footprint); a burst
 * keeps it above 0.5.
 */
export const BUSY_SHARE = 0.25;
const SAMPLE_MS = 1000;

/**
 * Turns V8's optimizing compilers on at the first second after this call (the service listens)
 * in which the event loop is busy `busyShare` of the time, checked on a timer that keeps no
 * process alive. Only the compilers this process started without through DEFERRING_FLAGS are
 * turned on: an operator's own flags win. Returns a stop function; `onResume` is told the busy
 * share that did it.
 */
export function resumeOptimizationOnceBusy(
  onResume: (share: number) => void,
  execArgv: readonly string[] = process.execArgv,
  busyShare = BUSY_SHARE,
): () => void {
  const deferred = DEFERRING_FLAGS.filter((flag) => execArgv.includes(flag));
  if (deferred.length === 0) return () => {};
  let last = performance.eventLoopUtilization();
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    const share = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    if (share < busyShare) return;
    clearInterval(timer);
    for (const flag of deferred) setFlagsFromString(flag.replace(/^--no-/, "--"));
    onResume(share);
  }, SAMPLE_MS);
  timer.unref();
  return () => clearInterval(timer);
}
