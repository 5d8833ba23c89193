// Percentiles, for the figures the services act on (the memory store's watch of its vector
// index) and the ones the benchmarks print.

/** The p-th percentile (nearest rank) of xs; undefined for an empty list. */
export const pct = (xs: readonly number[], p: number): number =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
