// Offline validation of Kubernetes objects against the API's own types, as shipped in
// @kubernetes/client-node (each model class lists its fields and their types, generated from the
// Kubernetes OpenAPI document). Unknown fields are errors, as the API server's strict field
// validation makes them (kubectl apply --validate=strict): a misspelt key would otherwise be
// dropped silently and the setting it meant would never apply.
import * as k8s from "@kubernetes/client-node";

interface Attribute {
  baseName: string;
  type: string;
}
type Model = { getAttributeTypeMap(): Attribute[] };

const models = k8s as unknown as Record<string, Model | undefined>;

/** The model class of a top-level object: apps/v1 Deployment -> V1Deployment. */
function modelOf(apiVersion: string, kind: string): string | undefined {
  const version = apiVersion.split("/").pop() ?? "";
  const name = `${version.charAt(0).toUpperCase()}${version.slice(1)}${kind}`;
  return models[name]?.getAttributeTypeMap ? name : undefined;
}

/** Every problem of one value against a type of the generated models, each with its path. */
function check(value: unknown, type: string, at: string, out: string[]): void {
  if (value === null || value === undefined) return;
  const array = /^Array<(.+)>$/.exec(type);
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  const is = (ok: boolean, what: string) => ok || out.push(`${at}: must be ${what}, not ${JSON.stringify(value)}`);
  if (array) {
    if (!Array.isArray(value)) return void is(false, "a list");
    for (const [i, v] of value.entries()) check(v, array[1], `${at}[${i}]`, out);
  } else if (map) {
    if (typeof value !== "object" || Array.isArray(value)) return void is(false, "a map");
    for (const [k, v] of Object.entries(value)) check(v, map[1], `${at}.${k}`, out);
  } else if (type === "string" || type === "Date") is(typeof value === "string", "a string");
  else if (type === "number") is(typeof value === "number", "a number");
  else if (type === "boolean") is(typeof value === "boolean", "true or false");
  else if (type === "IntOrString") is(typeof value === "string" || typeof value === "number", "a number or a string");
  else if (type === "any" || type === "object") return;
  else {
    const model = models[type];
    if (!model?.getAttributeTypeMap) return void out.push(`${at}: the validator does not know the type ${type}`);
    if (typeof value !== "object" || Array.isArray(value)) return void is(false, `an object (${type})`);
    const fields = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
    for (const [k, v] of Object.entries(value)) {
      const t = fields.get(k);
      if (t === undefined) out.push(`${at}.${k}: unknown field (${type} has no such field)`);
      else check(v, t, `${at}.${k}`, out);
    }
  }
}

/** The problems of one object (empty when it is valid). `name` prefixes every message. */
export function validateObject(obj: unknown): string[] {
  const o = obj as { apiVersion?: unknown; kind?: unknown; metadata?: { name?: unknown; namespace?: unknown } };
  if (typeof o?.apiVersion !== "string" || typeof o.kind !== "string") return ["an object without apiVersion and kind"];
  const name = `${o.kind} ${String(o.metadata?.namespace ?? "")}/${String(o.metadata?.name ?? "?")}`;
  const model = modelOf(o.apiVersion, o.kind);
  if (!model) return [`${name}: ${o.apiVersion} ${o.kind} is not a kind this Kubernetes version knows`];
  const out: string[] = [];
  check(obj, model, name, out);
  return out;
}
