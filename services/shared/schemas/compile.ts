// Compiles each JSON Schema of services/shared/schemas/ to a validator module at build time (`make
// build` runs this after tsc), with ajv's standalone code generation. A service that reads one of
// these files at start then loads that validator alone, not ajv and its code generator: 2 MB of
// the gateway's resident memory, which checks the API keys file (bench/history.md,
// bench/footprint), and the schema's compilation at each start. The runner still loads ajv when
// it first checks a tool's arguments, whose schemas come from the agents.
//
//   node dist/services/shared/schemas/compile.js    (writes <name>.validate.cjs beside this file)
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Ajv2020 } from "ajv/dist/2020.js";
import standalone from "ajv/dist/standalone/index.js";
import { SCHEMAS, type SchemaName, validatorFile } from "../json-schema.js";

/** The validator module of schema `name`, as this ajv compiles it. */
export function validatorSource(name: SchemaName): string {
  const ajv = new Ajv2020({ allErrors: true, verbose: true, strict: true, code: { source: true } });
  // "message": how a value breaking this schema is described, in place of ajv's wording.
  ajv.addKeyword({ keyword: "message", schemaType: "string" });
  return standalone.default(ajv, ajv.compile(SCHEMAS[name]));
}

if (process.argv[1] === fileURLToPath(import.meta.url))
  for (const name of Object.keys(SCHEMAS) as SchemaName[])
    writeFileSync(new URL(validatorFile(name), new URL("../", import.meta.url)), validatorSource(name));
