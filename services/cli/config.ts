// `troupe config`: every environment variable Troupe reads, with the value in force (secrets
// masked) and what it sets; then any TROUPE_* variable set that Troupe does not read. Exit code 1
// when the configuration does not load (the message says which setting and why).
// `troupe config validate FILE [--kind K]` checks an operator's JSON file the way the service
// that reads it does; `troupe config schema K` prints the file's JSON Schema.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { parseRouting } from "../router/bindings.js";
import { parseAgentConfig } from "../runner/agent-config.js";
import { parseProviders } from "../shared/models/providers.js";
import { parseKeys } from "../shared/auth/api-keys.js";
import { effectiveEnvironment, loadConfig, unknownVariables } from "../shared/config/config.js";
import { SCHEMAS, type SchemaName, parseJson, schemaProblems } from "../shared/json-schema.js";
import { parseQuotas } from "../shared/auth/quotas.js";
import { routingWarnings } from "./shared-dms.js";

/** Where the command writes (a test passes its own). */
export interface Output {
  out(text: string): void;
  err(text: string): void;
}
const STDIO: Output = { out: (t) => process.stdout.write(t), err: (t) => process.stderr.write(t) };

/**
 * Each kind of file, checked by the parser its service uses (schema first, then the rest); what
 * it returns are warnings: valid, but probably not what the operator wants.
 */
const CHECKS: Record<SchemaName, (text: string, file: string) => string[] | void> = {
  agent: (text, file) => {
    try {
      parseAgentConfig(path.basename(path.dirname(file)), parseJson(text, file));
    } catch (err) {
      throw new Error(
        (err as Error).message.startsWith(file) ? (err as Error).message : `${file}: ${(err as Error).message}`,
      );
    }
  },
  routing: (text, file) => routingWarnings(parseRouting(text, file), file),
  "api-keys": (text, file) => void parseKeys(text, file),
  quotas: (text, file) => void parseQuotas(text, file),
  providers: (text, file) => void parseProviders(text, file),
  "webhook-message": (text, file) => {
    const problems = schemaProblems("webhook-message", parseJson(text, file));
    if (problems.length > 0) throw new Error(`${file}: ${problems.join("; ")}`);
  },
};

/** The kind of a file from its name, as Troupe names them by default. */
export function kindOf(file: string): SchemaName | undefined {
  const name = path.basename(file);
  if (name === "agent.json") return "agent";
  if (name.includes("routing")) return "routing";
  if (name.includes("keys")) return "api-keys";
  if (name.includes("quota")) return "quotas";
  if (name.includes("provider")) return "providers";
  return undefined;
}

const KINDS = Object.keys(SCHEMAS).join(", ");

export async function configCommand(args: string[], io: Output = STDIO): Promise<number> {
  if (args[0] === "validate") return validate(args.slice(1), io);
  if (args[0] === "schema") {
    const kind = args[1] as SchemaName;
    if (!(kind in SCHEMAS)) {
      io.err(`troupe config schema: name one of ${KINDS}\n`);
      return 2;
    }
    io.out(`${JSON.stringify(SCHEMAS[kind], null, 2)}\n`);
    return 0;
  }
  try {
    const cfg = loadConfig(args);
    io.out(`data directory: ${cfg.dataDir}\n`);
  } catch (err) {
    io.err(`troupe config: ${(err as Error).message}\n`);
    return 1;
  }
  const rows = effectiveEnvironment().map((e) => [e.name, e.value, e.doc]);
  const widths = [0, 1].map((i) => Math.max(...rows.map((r) => r[i].length), 8));
  for (const r of [["VARIABLE", "VALUE", "SETS"], ...rows]) {
    io.out(`${r[0].padEnd(widths[0])}  ${r[1].padEnd(widths[1])}  ${r[2]}\n`);
  }
  for (const name of unknownVariables()) io.err(`troupe config: ${name} is set but Troupe reads no such variable\n`);
  return 0;
}

/** validate FILE [--kind K]: 0 when the file is valid, 1 when it is not, 2 for a wrong call. */
async function validate(args: string[], io: Output): Promise<number> {
  const at = args.indexOf("--kind");
  const named = at >= 0 ? args[at + 1] : undefined;
  const files = at < 0 ? args : args.filter((_, i) => i !== at && i !== at + 1);
  if (files.length !== 1 || (at >= 0 && !(named! in SCHEMAS))) {
    io.err(`usage: troupe config validate FILE [--kind ${KINDS.replace(/, /g, "|")}]\n`);
    return 2;
  }
  const file = files[0];
  const kind = (named as SchemaName | undefined) ?? kindOf(file);
  if (!kind) {
    io.err(`troupe config validate: cannot tell what ${file} is from its name; say --kind (${KINDS})\n`);
    return 2;
  }
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    io.err(`troupe config validate: ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}\n`);
    return 1;
  }
  try {
    for (const warning of CHECKS[kind](text, file) ?? []) io.err(`troupe config validate: warning: ${warning}\n`);
  } catch (err) {
    io.err(`troupe config validate: ${(err as Error).message}\n`);
    return 1;
  }
  io.out(`${file}: a valid ${kind} file\n`);
  return 0;
}
