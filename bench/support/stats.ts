// Percentiles for the benchmarks' figures: the services' own (services/shared/stats.ts).
export { pct } from "../../services/shared/stats.js";
