// `troupe config`: every environment variable Troupe reads, with the value in force (secrets
// masked) and what it sets; then any TROUPE_* variable set that Troupe does not read. Exit code 1
// when the configuration does not load (the message says which setting and why).
import { effectiveEnvironment, loadConfig, unknownVariables } from "../shared/config.js";

export function configCommand(args: string[]): number {
  try {
    const cfg = loadConfig(args);
    process.stdout.write(`data directory: ${cfg.dataDir}\n`);
  } catch (err) {
    process.stderr.write(`troupe config: ${(err as Error).message}\n`);
    return 1;
  }
  const rows = effectiveEnvironment().map((e) => [e.name, e.value, e.doc]);
  const widths = [0, 1].map((i) => Math.max(...rows.map((r) => r[i].length), 8));
  for (const r of [["VARIABLE", "VALUE", "SETS"], ...rows]) {
    process.stdout.write(`${r[0].padEnd(widths[0])}  ${r[1].padEnd(widths[1])}  ${r[2]}\n`);
  }
  const unknown = unknownVariables();
  for (const name of unknown) process.stderr.write(`troupe config: ${name} is set but Troupe reads no such variable\n`);
  return 0;
}
