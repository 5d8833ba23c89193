// Percentiles for the benchmarks' figures: the services' own (services/memory/stats.ts).
export { pct } from "../../services/memory/stats.js";
