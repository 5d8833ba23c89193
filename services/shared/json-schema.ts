// The JSON files operators write (agent.json, routing.json, the API keys, quotas and providers files)
// are checked against the JSON Schemas in services/shared/schemas/, the same files an editor or
// another tool can use. A document gets every problem at once, each named by where it is
// ("bindings[0].match.channel is required"); checks a schema cannot state (a value used twice,
// one field needing another) stay with each file's parser. Each schema is compiled to a validator
// module at build time (schemas/compile.ts), loaded with the first file of its kind checked: a
// process given none of these files loads none, and none loads ajv for them.
import { fileURLToPath } from "node:url";
import type { ErrorObject, ValidateFunction } from "ajv/dist/2020.js";
import { lazyModule } from "./process/lazy-module.js";
import agent from "./schemas/agent.schema.json" with { type: "json" };
import apiKeys from "./schemas/api-keys.schema.json" with { type: "json" };
import providers from "./schemas/providers.schema.json" with { type: "json" };
import quotas from "./schemas/quotas.schema.json" with { type: "json" };
import routing from "./schemas/routing.schema.json" with { type: "json" };
import webhookMessage from "./schemas/webhook-message.schema.json" with { type: "json" };

export const SCHEMAS = {
  agent,
  routing,
  "api-keys": apiKeys,
  quotas,
  providers,
  "webhook-message": webhookMessage,
} as const;
export type SchemaName = keyof typeof SCHEMAS;

/** Where schema `name`'s compiled validator is, relative to this module. */
export const validatorFile = (name: SchemaName) => `./schemas/${name}.validate.cjs`;

const validators = new Map(
  (Object.keys(SCHEMAS) as SchemaName[]).map((name) => [
    name,
    // By its whole path: lazyModule resolves a relative name from its own folder, not this one's.
    lazyModule<ValidateFunction>(fileURLToPath(new URL(validatorFile(name), import.meta.url))),
  ]),
);

/** The schema's validator, loaded on first use. */
function validatorOf(name: SchemaName): ValidateFunction {
  try {
    return validators.get(name)!();
  } catch (err) {
    throw new Error(`the ${name} schema's validator is not built (make build compiles it): ${(err as Error).message}`);
  }
}

/** Parses JSON, or throws naming the source. */
export function parseJson(text: string, source: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`${source}: not JSON (${(err as Error).message})`);
  }
}

/** What is wrong with `doc` by schema `name`, one line per problem; empty when it conforms. */
export function schemaProblems(name: SchemaName, doc: unknown): string[] {
  const validate = validatorOf(name);
  return validate(doc) ? [] : problemsOf(validate);
}

function problemsOf(validate: ValidateFunction): string[] {
  const problems = new Set<string>();
  for (const e of validate.errors ?? []) {
    const line = describe(e);
    if (line) problems.add(line);
  }
  return [...problems];
}

/** "/bindings/0/match" -> "bindings[0].match". */
function pathOf(pointer: string): string {
  let out = "";
  for (const raw of pointer.split("/").slice(1)) {
    const seg = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    out += /^\d+$/.test(seg) ? `[${seg}]` : out === "" ? seg : `.${seg}`;
  }
  return out;
}

const join = (path: string, field: string) => (path === "" ? field : `${path}.${field}`);

const TYPE_WORDS: Record<string, string> = {
  object: "a JSON object",
  array: "a list",
  string: "a string",
  boolean: "true or false",
  number: "a number",
};

function describe(e: ErrorObject): string | undefined {
  // An error inside propertyNames is reported once, by the propertyNames error itself.
  if (e.propertyName !== undefined) return undefined;
  const path = pathOf(e.instancePath);
  const where = path === "" ? "the document" : path;
  const schema = (e.parentSchema ?? {}) as Record<string, unknown>;
  switch (e.keyword) {
    case "required":
      return `${join(path, (e.params as { missingProperty: string }).missingProperty)} is required`;
    case "additionalProperties": {
      const known = Object.keys((schema.properties ?? {}) as object).join(", ");
      const field = (e.params as { additionalProperty: string }).additionalProperty;
      return `${path === "" ? "" : `${path}: `}unknown field ${field} (known: ${known})`;
    }
    case "propertyNames":
      return `${where} has a name that is not allowed: ${JSON.stringify((e.params as { propertyName: string }).propertyName)}`;
  }
  if (typeof schema.message === "string") return `${where} ${schema.message}`;
  if (schema.type === "integer" && ["type", "minimum", "maximum"].includes(e.keyword)) {
    const { minimum: min, maximum: max } = schema as { minimum?: number; maximum?: number };
    if (min !== undefined && max !== undefined) return `${where} must be an integer from ${min} to ${max}`;
    if (min !== undefined) return `${where} must be an integer of at least ${min}`;
    return `${where} must be an integer`;
  }
  if (e.keyword === "type") return `${where} must be ${TYPE_WORDS[String(schema.type)] ?? schema.type}`;
  if (e.keyword === "enum") return `${where} must be one of ${(schema.enum as unknown[]).join(", ")}`;
  return `${where} ${e.message}`;
}
