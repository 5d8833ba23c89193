// Percentiles for the benchmarks' figures: the services' own (services/memory/stats.ts); and
// timing a call made n times, `parallel` at a time.
import { pct } from "../../services/memory/stats.js";

export { pct };

/** The middle value (the upper one of an even count), as pct(xs, 50). */
export const median = (xs: readonly number[]): number => pct(xs, 50);

export interface Measured {
  p50: number;
  p99: number;
  perSec: number;
}

/** Latencies of n calls of `fn`, `parallel` at a time, and the rate they were done at. */
export async function measure(fn: () => Promise<void>, n: number, parallel: number): Promise<Measured> {
  const lat: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: parallel }, async () => {
      while (next++ < n) {
        const t = performance.now();
        await fn();
        lat.push(performance.now() - t);
      }
    }),
  );
  return { p50: pct(lat, 50), p99: pct(lat, 99), perSec: (n / (performance.now() - t0)) * 1000 };
}
