// The model providers Troupe calls (the runner for turns, the memory service for learning and
// embeddings), from the providers file. Models are named `provider/model` ("openai/gpt-5-mini", "local/llama3.1"), so a fallback
// chain may leave a provider that is down. A name whose prefix is no provider's goes whole to
// the default provider: vLLM and Ollama serve models named like "meta-llama/Llama-3.1-8B".
//
// Without a providers file there is one provider, "default", from OPENAI_BASE_URL and
// OPENAI_API_KEY (or the scripted model server), so existing deployments keep working.
import { readFileSync } from "node:fs";
import { secretFrom } from "../config/config.js";
import { parseJson, schemaProblems } from "../json-schema.js";

export type ProviderKind = "openai" | "openai-responses" | "openai-compatible" | "anthropic";

/** The providers file's fields only some kinds take; another kind naming one is refused. */
const KIND_FIELDS: readonly {
  name: "organization" | "project" | "thinkingDisplay";
  kinds: readonly ProviderKind[];
  whose: string;
}[] = [
  { name: "organization", kinds: ["openai", "openai-responses", "openai-compatible"], whose: "OpenAI's" },
  { name: "project", kinds: ["openai", "openai-responses", "openai-compatible"], whose: "OpenAI's" },
  { name: "thinkingDisplay", kinds: ["anthropic"], whose: "Anthropic's" },
];

export interface ProviderSpec {
  name: string;
  kind: ProviderKind;
  baseUrl: string;
  /** The key itself, read from where the file says; never logged. */
  apiKey: string;
  /** Sent with every request: OpenAI-Organization and OpenAI-Project when configured. */
  headers?: Readonly<Record<string, string>>;
  timeoutMs: number;
  idleTimeoutMs: number;
  /** Models that take images besides those model-rules.ts knows: names, or prefixes ending in *. */
  visionModels: readonly string[];
  /** Anthropic only: how adaptive thinking comes back (anthropic-model.ts); absent: summarized. */
  thinkingDisplay?: ThinkingDisplay;
}

export type ThinkingDisplay = "summarized" | "omitted";

export interface Providers {
  byName: ReadonlyMap<string, ProviderSpec>;
  /** Serves model names without a known provider prefix; undefined: such names are refused. */
  defaultName?: string;
}

interface ProviderEntry {
  kind: ProviderKind;
  baseUrl: string;
  organization?: string;
  project?: string;
  apiKey?: { env?: string; file?: string };
  timeoutMs?: number;
  idleTimeoutMs?: number;
  visionModels?: string[];
  thinkingDisplay?: ThinkingDisplay;
}

/** A providers file's text, checked (schemas/providers.schema.json), with its keys read. */
export function parseProviders(text: string, source: string): Providers {
  const doc = parseJson(text, source);
  const problems = schemaProblems("providers", doc);
  if (problems.length > 0) throw new Error(`${source}: ${problems.join("; ")}`);
  const { providers, default: named } = doc as { providers: Record<string, ProviderEntry>; default?: string };
  const byName = new Map<string, ProviderSpec>();
  for (const [name, p] of Object.entries(providers)) {
    let apiKey = "";
    if (p.apiKey) {
      try {
        apiKey = secretFrom(p.apiKey);
      } catch (err) {
        throw new Error(`${source}: providers.${name}.apiKey: ${(err as Error).message}`);
      }
    }
    for (const field of KIND_FIELDS) {
      if (p[field.name] !== undefined && !field.kinds.includes(p.kind))
        throw new Error(
          `${source}: providers.${name}: ${field.name} is ${field.whose}; a ${p.kind} provider takes none`,
        );
    }
    byName.set(name, {
      name,
      kind: p.kind,
      baseUrl: p.baseUrl,
      apiKey,
      headers: openAIHeaders(p),
      timeoutMs: p.timeoutMs ?? 60_000,
      idleTimeoutMs: p.idleTimeoutMs ?? 120_000,
      visionModels: p.visionModels ?? [],
      ...(p.thinkingDisplay ? { thinkingDisplay: p.thinkingDisplay } : {}),
    });
  }
  if (named !== undefined && !byName.has(named))
    throw new Error(`${source}: default names ${JSON.stringify(named)}, which is not one of the providers`);
  return { byName, defaultName: named ?? (byName.size === 1 ? [...byName.keys()][0] : undefined) };
}

export function loadProviders(file: string): Providers {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new Error(`${file}: cannot read the providers file (${(err as NodeJS.ErrnoException).code ?? err})`);
  }
  return parseProviders(text, file);
}

/** The single provider of a runner configured by OPENAI_BASE_URL and OPENAI_API_KEY alone. */
export function singleProvider(
  baseUrl: string,
  apiKey: string,
  account: { organization?: string; project?: string } = {},
): Providers {
  const kind: ProviderKind = new URL(baseUrl).hostname.endsWith("api.openai.com") ? "openai" : "openai-compatible";
  const headers = openAIHeaders(account);
  const spec = {
    name: "default",
    kind,
    baseUrl,
    apiKey,
    headers,
    timeoutMs: 60_000,
    idleTimeoutMs: 120_000,
    visionModels: [],
  };
  return { byName: new Map([["default", spec]]), defaultName: "default" };
}

/**
 * OpenAI's optional account headers (platform.openai.com/docs/api-reference/authentication): which
 * organization and project a request counts against, for a key that reaches more than one.
 */
function openAIHeaders(account: { organization?: string; project?: string }): Record<string, string> | undefined {
  const headers: Record<string, string> = {};
  if (account.organization) headers["openai-organization"] = account.organization;
  if (account.project) headers["openai-project"] = account.project;
  return Object.keys(headers).length > 0 ? headers : undefined;
}

/** Which provider serves `name`, and the model's name there; undefined when none does. */
export function resolveModel(
  providers: Providers,
  name: string,
): { provider: ProviderSpec; model: string } | undefined {
  const slash = name.indexOf("/");
  const named = slash > 0 ? providers.byName.get(name.slice(0, slash)) : undefined;
  if (named) return { provider: named, model: name.slice(slash + 1) };
  const fallback = providers.defaultName ? providers.byName.get(providers.defaultName) : undefined;
  return fallback && { provider: fallback, model: name };
}
