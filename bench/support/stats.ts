// Percentiles for the benchmarks' figures.

/** The p-th percentile (nearest rank) of xs. */
export const pct = (xs: number[], p: number): number => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
