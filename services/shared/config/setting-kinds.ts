// What a setting is, the shapes its values take, and how a value is checked against its shape,
// for the tables of settings.ts and the files beside it (telemetry-settings.ts,
// client-settings.ts). A shape is written as a small JSON Schema (so `troupe config` and the
// docs/settings.md can show it), but only the keywords below are allowed: the environment is checked at
// every start of every process, and a general validator there cost each process 83 modules,
// about 2.5 MB of heap and 100 ms (bench/history.md, footprint). The JSON files operators
// write are still checked by json-schema.ts.

export interface Setting {
  env: string;
  /** Also read in lower case, which wins when both are set (the proxy variables, as curl and undici read them). */
  lowerCase?: boolean;
  flag?: string;
  doc: string;
  default?: string | number;
  schema?: SettingSchema;
  secret?: boolean;
}

/** A setting's shape; `message` is how a value breaking it is worded ("must be ..."). */
export interface SettingSchema {
  type?: "string" | "integer" | "number";
  enum?: string[];
  pattern?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  message?: string;
}

export const int = (min = 1): SettingSchema => ({
  type: "integer",
  minimum: min,
  message: min === 1 ? "must be a positive integer" : `must be an integer of at least ${min}`,
});
export const positive: SettingSchema = { type: "number", exclusiveMinimum: 0, message: "must be a positive number" };
export const oneOf = (...values: string[]): SettingSchema => ({
  enum: values,
  message: `must be one of ${values.join(", ")}`,
});
export const address = (env: string, flag: string, what: string, port: number): Setting => ({
  env,
  flag,
  doc: `${what} address`,
  default: `127.0.0.1:${port}`,
});

const KEYWORDS = new Set(["type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "message"]);

/**
 * A checker for the settings `table`: given each setting's value as text (or a table default),
 * it turns the numbers into numbers in place and returns one "<name> <message>" per value that
 * breaks its shape. Throws at once on a shape it cannot check, so the table cannot outgrow it.
 */
export function settingsChecker(table: [string, Setting][]): (values: Record<string, unknown>) => string[] {
  const checks: [string, (v: unknown) => unknown, string][] = [];
  for (const [name, { schema }] of table) {
    if (!schema) continue;
    const unknown = Object.keys(schema).filter((k) => !KEYWORDS.has(k));
    if (unknown.length > 0) throw new Error(`setting ${name}: cannot check ${unknown.join(", ")}`);
    if (!schema.message) throw new Error(`setting ${name}: a checked setting needs a message`);
    checks.push([name, valueChecker(schema), schema.message]);
  }
  return (values) => {
    const problems: string[] = [];
    for (const [name, check, message] of checks) {
      if (values[name] === undefined) continue;
      const value = check(values[name]);
      if (value === undefined) problems.push(`${name} ${message}`);
      else values[name] = value;
    }
    return problems;
  };
}

/** The value as its shape wants it (a number from its text), or undefined when it breaks it. */
function valueChecker(s: SettingSchema): (v: unknown) => unknown {
  const pattern = s.pattern === undefined ? undefined : new RegExp(s.pattern, "u");
  return (v) => {
    if (s.enum && !s.enum.includes(String(v))) return undefined;
    if (s.type === "integer" || s.type === "number") {
      const n = typeof v === "number" ? v : typeof v === "string" && v.trim() !== "" ? Number(v) : Number.NaN;
      if (!Number.isFinite(n) || (s.type === "integer" && !Number.isInteger(n))) return undefined;
      if (s.minimum !== undefined && n < s.minimum) return undefined;
      if (s.maximum !== undefined && n > s.maximum) return undefined;
      if (s.exclusiveMinimum !== undefined && n <= s.exclusiveMinimum) return undefined;
      return n;
    }
    if (typeof v !== "string") return undefined;
    return pattern && !pattern.test(v) ? undefined : v;
  };
}
