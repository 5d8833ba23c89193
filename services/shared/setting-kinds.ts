// What a setting is, and the shapes its values take, for the tables of settings.ts and the files
// beside it (telemetry-settings.ts, client-settings.ts). A schema's "message" is how config.ts
// words a value that breaks it.

export interface Setting {
  env: string;
  flag?: string;
  doc: string;
  default?: string | number;
  schema?: Record<string, unknown>;
  secret?: boolean;
}

export const int = (min = 1) => ({
  type: "integer",
  minimum: min,
  message: min === 1 ? "must be a positive integer" : `must be an integer of at least ${min}`,
});
export const positive = { type: "number", exclusiveMinimum: 0, message: "must be a positive number" };
export const oneOf = (...values: string[]) => ({ enum: values, message: `must be one of ${values.join(", ")}` });
export const address = (env: string, flag: string, what: string, port: number): Setting => ({
  env,
  flag,
  doc: `${what} address`,
  default: `127.0.0.1:${port}`,
});
