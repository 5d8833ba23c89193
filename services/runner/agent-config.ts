// What an operator says about one agent, in `<agents dir>/<agent id>/agent.json`. Every field is
// optional; a missing file means the defaults. The file is read again when it changes, so an
// edit takes effect within a second, without a restart. Its schema: shared/schemas/agent.schema.json.
//
//   {
//     "name": "Ada",                          // how the agent calls itself
//     "persona": "A careful research aide.",  // its identity, personality and tone
//     "model": "openai/gpt-5-mini",           // provider/model (providers.ts)
//     "fallbacks": ["local/llama3.1"],        // may cross providers
//     "models": ["anthropic/claude-sonnet-4-6"],  // a session may choose these too (or the two above)
//     "reasoningEffort": "low", "temperature": 0.2,  // each sent only where the model takes it
//     "contextWindow": 128000, "maxOutputTokens": 4096,
//     "reserveTokens": 16384, "keepRecentTokens": 20000,
//     "owners": ["alice"],                    // principals of the session's tenant who own the agent
//     "retry": { "maxRetries": 3, "baseDelayMs": 1000, "maxDelayMs": 30000 },
//     "subagents": { "maxDepth": 1, "maxChildren": 5, "timeoutMs": 120000 },
//     "tools": ["exec", "read_file"],         // the tools it is offered (default: all)
//     "webFetch": true,                       // web_fetch of public pages
//     "http": { "allowHosts": ["api.github.com"], "secrets": { "GITHUB_TOKEN": ["api.github.com"] } },
//     "egress": { "allowHosts": ["registry.npmjs.org"], "budgetMb": 1024 },  // sandboxed commands' way out
//     "workspace": { "image": "troupe-sandbox:python", "files": "starter" },  // or "snapshot": "snap-..."
//     "timeZone": "Europe/Berlin",            // the users' time zone: the prompt's clock says it
//     "approvals": { "tools": { "exec": "ask" } },  // calls that wait for a person (tools/approvals.ts)
//     "mcpServers": { "docs": { "url": "https://mcp.example.com/mcp" } }  // tools/mcp/mcp-config.ts
//   }
import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import { schemaProblems } from "../shared/json-schema.js";
import type { ReasoningEffort } from "../shared/models/model-rules.js";
import { type ApprovalPolicy, policyProblems } from "./tools/approvals.js";
import { type McpServers, type McpServerSpec, serverProblems } from "./tools/mcp/mcp-config.js";

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
  /** Models a session may choose besides `model` and `fallbacks` (sessionModel). */
  models: string[];
  /** Sent only to models that take it (model-rules.ts). */
  temperature?: number;
  reasoningEffort?: ReasoningEffort;
  /** Sessions idle longer than this many days are deleted (retention.ts); undefined: kept. */
  retentionDays?: number;
  contextWindow: number;
  maxOutputTokens: number;
  reserveTokens: number;
  keepRecentTokens: number;
  owners: string[];
  retry: RetryPolicy;
  subagents: { maxDepth: number; maxChildren: number; timeoutMs: number };
  /** The tools offered (names); undefined: every tool (toolOffered). */
  tools?: string[];
  /** web_fetch is offered (web-tools.ts). */
  webFetch: boolean;
  /** http_request's hosts, and the secrets it may send to which hosts (web-tools.ts). */
  http: { allowHosts: string[]; secrets: Record<string, string[]> };
  /** Hosts sandboxed commands reach through the sandbox's egress proxy; empty: no network. */
  egress: { allowHosts: string[]; budgetMb: number };
  /** The template the agent's sandboxes start from (tools/workspace-templates.ts); undefined: none. */
  workspace?: { image?: string; files?: string; snapshot?: string };
  /** The users' time zone (IANA name): the prompt's current time is said in it; absent: UTC. */
  timeZone?: string;
  /** Which tool calls wait for a person's decision (tools/approvals.ts); undefined: none. */
  approvals?: ApprovalPolicy;
  /** MCP servers whose tools runs are offered, and a tenant's own (tools/mcp/mcp-config.ts). */
  mcpServers?: McpServers;
  mcpTenants?: Record<string, Record<string, McpServerSpec | null>>;
}

export const DEFAULT_AGENT: Readonly<Omit<AgentConfig, "name">> = {
  persona: "",
  model: "",
  fallbacks: [],
  models: [],
  contextWindow: 128_000,
  maxOutputTokens: 4096,
  reserveTokens: 16_384,
  keepRecentTokens: 20_000,
  owners: [],
  retry: { maxRetries: 3, baseDelayMs: 1000, maxDelayMs: 30_000 },
  subagents: { maxDepth: 1, maxChildren: 5, timeoutMs: 120_000 },
  webFetch: true,
  http: { allowHosts: [], secrets: {} },
  egress: { allowHosts: [], budgetMb: 1024 },
};

/**
 * Whether a run of this agent offers the tool: named in `tools` (when given), web_fetch unless
 * turned off, http_request only with hosts to call. Each tool's schema costs tokens on every
 * model call (the four web, schedule and process tools about 700), so what an agent cannot or
 * need not use is left out.
 */
export function toolOffered(agent: AgentConfig, name: string): boolean {
  if (agent.tools && !agent.tools.includes(name)) return false;
  if (name === "web_fetch") return agent.webFetch;
  if (name === "http_request") return agent.http.allowHosts.length > 0;
  return true;
}

/** The sandbox's way out for the agent's commands (an Exec's grant); undefined: no network. */
export function egressGrant(agent: AgentConfig): { allowHosts: string[]; budgetBytes: bigint } | undefined {
  const { allowHosts, budgetMb } = agent.egress;
  return allowHosts.length > 0 ? { allowHosts, budgetBytes: BigInt(budgetMb) << 20n } : undefined;
}

/**
 * The model a session's run starts with: the session's choice while its agent still allows it
 * (its model, a fallback, or one of `models`), else the agent's own. `refused` says why a choice
 * was set aside.
 */
export function sessionModel(
  agentId: string,
  agent: AgentConfig,
  defaultModel: string,
  chosen: string,
): { model: string; refused?: string } {
  const own = agent.model || defaultModel;
  if (chosen === "" || chosen === own || agent.fallbacks.includes(chosen) || agent.models.includes(chosen))
    return { model: chosen || own };
  const allowed = [...new Set([own, ...agent.fallbacks, ...agent.models])].join(", ");
  return { model: own, refused: `model ${chosen} is not one agent ${agentId} allows (it allows ${allowed})` };
}

/** An agent.json that cannot be used; the run goes on with the defaults and says why. */
export class AgentConfigError extends Error {}

/** Checks a parsed agent.json against its schema (schemas/agent.schema.json) and fills in the defaults. */
export function parseAgentConfig(agentId: string, json: unknown): AgentConfig {
  const problems = schemaProblems("agent", json);
  if (problems.length > 0) throw new AgentConfigError(problems.join("; "));
  const o = json as Partial<AgentConfig>;
  const d = DEFAULT_AGENT;
  const cfg: AgentConfig = {
    ...d,
    ...o,
    name: o.name ?? agentId,
    retry: { ...d.retry, ...o.retry },
    subagents: { ...d.subagents, ...o.subagents },
    http: { ...d.http, ...o.http },
    egress: { ...d.egress, ...o.egress },
  };
  if (cfg.timeZone !== undefined) {
    try {
      new Intl.DateTimeFormat("en-US", { timeZone: cfg.timeZone });
    } catch {
      throw new AgentConfigError(
        `timeZone ${JSON.stringify(cfg.timeZone)} is not a time zone (IANA names such as Europe/Berlin)`,
      );
    }
  }
  const badPatterns = [
    ...policyProblems(cfg.approvals),
    ...serverProblems(cfg.mcpServers, "mcpServers"),
    ...Object.entries(cfg.mcpTenants ?? {}).flatMap(([t, own]) =>
      serverProblems(
        Object.fromEntries(Object.entries(own).filter(([, v]) => v !== null)) as McpServers,
        `mcpTenants.${t}`,
      ),
    ),
  ];
  if (badPatterns.length > 0) throw new AgentConfigError(badPatterns.join("; "));
  if (cfg.workspace?.files !== undefined && cfg.workspace.snapshot !== undefined)
    throw new AgentConfigError("workspace names files and a snapshot: a workspace starts from one of them");
  if (cfg.reserveTokens >= cfg.contextWindow)
    throw new AgentConfigError(
      `reserveTokens (${cfg.reserveTokens}) must be below contextWindow (${cfg.contextWindow})`,
    );
  return cfg;
}

/**
 * agent.json files, each re-read when its modification time changes. Any well-formed agent id
 * names an agent (one without a folder has the defaults), so clients choose the keys: the cache
 * keeps the `capacity` agents used last.
 */
export class AgentConfigs {
  private readonly cache = new Map<string, { mtimeMs: number; checked: number; config: AgentConfig; error?: string }>();

  constructor(
    readonly agentsDir: string,
    /** How long a read is trusted before the file's time is looked at again. */
    private readonly recheckMs = 1000,
    private readonly capacity = 1000,
  ) {}

  /** Agents whose config is held (for tests). */
  get size(): number {
    return this.cache.size;
  }

  /** The folder of an agent's files. */
  dirOf(agentId: string): string {
    return path.join(this.agentsDir, agentId);
  }

  /** The agent's config, and why its file was not used if it was not. */
  async get(agentId: string): Promise<{ config: AgentConfig; error?: string }> {
    const file = path.join(this.dirOf(agentId), "agent.json");
    const now = Date.now();
    const hit = this.cache.get(agentId);
    if (hit) {
      // Used last: moved to the end, the far side from eviction.
      this.cache.delete(agentId);
      this.cache.set(agentId, hit);
      if (now - hit.checked < this.recheckMs) return hit;
    }
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
    this.cache.delete(agentId);
    this.cache.set(agentId, entry);
    if (this.cache.size > this.capacity) this.cache.delete(this.cache.keys().next().value!);
    return entry;
  }
}
