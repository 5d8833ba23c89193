// What an operator says about one agent, in `<agents dir>/<agent id>/agent.json`. Every field is
// optional; a missing file means the defaults. The file is read again when it changes, so an
// edit takes effect within a second, without a restart.
//
//   {
//     "name": "Ada",                          // how the agent calls itself
//     "persona": "A careful research aide.",  // its identity, personality and tone
//     "model": "gpt-4.1", "fallbacks": ["gpt-4.1-mini"],
//     "contextWindow": 128000, "maxOutputTokens": 4096,
//     "reserveTokens": 16384, "keepRecentTokens": 20000,
//     "owners": ["alice"],                    // principals of the session's tenant who own the agent
//     "retry": { "maxRetries": 3, "baseDelayMs": 1000, "maxDelayMs": 30000 },
//     "subagents": { "maxDepth": 1, "maxChildren": 5, "timeoutMs": 120000 }
//   }
import { readFile, stat } from "node:fs/promises";
import path from "node:path";

export interface RetryPolicy {
  /** Retries of one model call (so maxRetries + 1 attempts per model of the chain). */
  maxRetries: number;
  baseDelayMs: number;
  /** Longest wait between attempts; a longer Retry-After moves on to the next model instead. */
  maxDelayMs: number;
}

export interface AgentConfig {
  name: string;
  persona: string;
  /** Empty: the runner's model (TROUPE_MODEL). */
  model: string;
  fallbacks: string[];
  contextWindow: number;
  maxOutputTokens: number;
  reserveTokens: number;
  keepRecentTokens: number;
  owners: string[];
  retry: RetryPolicy;
  subagents: { maxDepth: number; maxChildren: number; timeoutMs: number };
}

export const DEFAULT_AGENT: Readonly<Omit<AgentConfig, "name">> = {
  persona: "",
  model: "",
  fallbacks: [],
  contextWindow: 128_000,
  maxOutputTokens: 4096,
  reserveTokens: 16_384,
  keepRecentTokens: 20_000,
  owners: [],
  retry: { maxRetries: 3, baseDelayMs: 1000, maxDelayMs: 30_000 },
  subagents: { maxDepth: 1, maxChildren: 5, timeoutMs: 120_000 },
};

/** An agent.json that cannot be used; the run goes on with the defaults and says why. */
export class AgentConfigError extends Error {}

type Checker<T> = (v: unknown, field: string) => T;
const num =
  (min: number, max: number): Checker<number> =>
  (v, field) => {
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max)
      throw new AgentConfigError(`${field} must be an integer from ${min} to ${max}`);
    return v;
  };
const str: Checker<string> = (v, field) => {
  if (typeof v !== "string" || v.length > 8000)
    throw new AgentConfigError(`${field} must be a string of at most 8000 characters`);
  return v;
};
const strings: Checker<string[]> = (v, field) => {
  if (!Array.isArray(v) || v.length > 20 || v.some((x) => typeof x !== "string" || x === ""))
    throw new AgentConfigError(`${field} must be a list of at most 20 non-empty strings`);
  return v as string[];
};

function pick<T>(obj: Record<string, unknown>, key: string, check: Checker<T>, fallback: T, prefix = ""): T {
  return obj[key] === undefined ? fallback : check(obj[key], prefix + key);
}

function object(v: unknown, field: string): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw new AgentConfigError(`${field} must be a JSON object`);
  return v as Record<string, unknown>;
}

export function parseAgentConfig(agentId: string, json: unknown): AgentConfig {
  const o = object(json, "agent.json");
  const known = new Set([
    "name",
    "persona",
    "model",
    "fallbacks",
    "contextWindow",
    "maxOutputTokens",
    "reserveTokens",
    "keepRecentTokens",
    "owners",
    "retry",
    "subagents",
  ]);
  const unknown = Object.keys(o).filter((k) => !known.has(k));
  if (unknown.length > 0) throw new AgentConfigError(`unknown field ${unknown[0]} (known: ${[...known].join(", ")})`);
  const d = DEFAULT_AGENT;
  const retry = o.retry === undefined ? {} : object(o.retry, "retry");
  const sub = o.subagents === undefined ? {} : object(o.subagents, "subagents");
  const cfg: AgentConfig = {
    name: pick(o, "name", str, agentId),
    persona: pick(o, "persona", str, d.persona),
    model: pick(o, "model", str, d.model),
    fallbacks: pick(o, "fallbacks", strings, d.fallbacks),
    contextWindow: pick(o, "contextWindow", num(512, 10_000_000), d.contextWindow),
    maxOutputTokens: pick(o, "maxOutputTokens", num(16, 1_000_000), d.maxOutputTokens),
    reserveTokens: pick(o, "reserveTokens", num(0, 1_000_000), d.reserveTokens),
    keepRecentTokens: pick(o, "keepRecentTokens", num(0, 10_000_000), d.keepRecentTokens),
    owners: pick(o, "owners", strings, d.owners),
    retry: {
      maxRetries: pick(retry, "maxRetries", num(0, 10), d.retry.maxRetries, "retry."),
      baseDelayMs: pick(retry, "baseDelayMs", num(0, 60_000), d.retry.baseDelayMs, "retry."),
      maxDelayMs: pick(retry, "maxDelayMs", num(0, 300_000), d.retry.maxDelayMs, "retry."),
    },
    subagents: {
      maxDepth: pick(sub, "maxDepth", num(0, 5), d.subagents.maxDepth, "subagents."),
      maxChildren: pick(sub, "maxChildren", num(0, 20), d.subagents.maxChildren, "subagents."),
      timeoutMs: pick(sub, "timeoutMs", num(1000, 3_600_000), d.subagents.timeoutMs, "subagents."),
    },
  };
  if (cfg.reserveTokens >= cfg.contextWindow)
    throw new AgentConfigError(
      `reserveTokens (${cfg.reserveTokens}) must be below contextWindow (${cfg.contextWindow})`,
    );
  return cfg;
}

/** agent.json files, each re-read when its modification time changes. */
export class AgentConfigs {
  private readonly cache = new Map<string, { mtimeMs: number; checked: number; config: AgentConfig; error?: string }>();

  constructor(
    readonly agentsDir: string,
    /** How long a read is trusted before the file's time is looked at again. */
    private readonly recheckMs = 1000,
  ) {}

  /** The folder of an agent's files. */
  dirOf(agentId: string): string {
    return path.join(this.agentsDir, agentId);
  }

  /** The agent's config, and why its file was not used if it was not. */
  async get(agentId: string): Promise<{ config: AgentConfig; error?: string }> {
    const file = path.join(this.dirOf(agentId), "agent.json");
    const now = Date.now();
    const hit = this.cache.get(agentId);
    if (hit && now - hit.checked < this.recheckMs) return hit;
    const mtimeMs = await stat(file).then(
      (s) => s.mtimeMs,
      () => -1,
    );
    if (hit && hit.mtimeMs === mtimeMs) {
      hit.checked = now;
      return hit;
    }
    let entry: { mtimeMs: number; checked: number; config: AgentConfig; error?: string };
    if (mtimeMs < 0) entry = { mtimeMs, checked: now, config: { name: agentId, ...DEFAULT_AGENT } };
    else {
      try {
        entry = { mtimeMs, checked: now, config: parseAgentConfig(agentId, JSON.parse(await readFile(file, "utf8"))) };
      } catch (err) {
        const why = err instanceof SyntaxError ? `not valid JSON: ${err.message}` : (err as Error).message;
        entry = {
          mtimeMs,
          checked: now,
          config: { name: agentId, ...DEFAULT_AGENT },
          error: `${file}: ${why}; using the defaults`,
        };
      }
    }
    this.cache.set(agentId, entry);
    return entry;
  }
}
