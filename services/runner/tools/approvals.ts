// The approval policy: which tool calls run as the model asks, which wait for a person's decision
// (ToolApprovalRequested), and which never run. It is the agent's (agent.json "approvals"), with
// a tenant's own rules replacing the agent's for the tools they name. Pure over its input: the
// loop asks it once per call, before the call's hooks (tool-calls.ts).
//
//   "approvals": {
//     "tools": {
//       "exec": { "mode": "ask", "allowArguments": { "command": ["ls( .*)?", "cat [^;|&]*"] } },
//       "web_fetch": { "mode": "ask", "allowHosts": { "url": ["docs.python.org", "*.github.com"] } },
//       "delete_memory": "deny",
//       "*": "allow"
//     },
//     "timeoutSeconds": 3600, "onTimeout": "deny",
//     "tenants": { "acme": { "tools": { "exec": "ask" } } }
//   }

export type ApprovalMode = "allow" | "ask" | "deny";

export type ToolRule =
  | ApprovalMode
  | {
      mode: ApprovalMode;
      /** Argument -> patterns: a call whose every named argument matches one in full is allowed. */
      allowArguments?: Record<string, string[]>;
      /** Argument (a URL) -> hosts: a call whose every named URL's host is listed is allowed. */
      allowHosts?: Record<string, string[]>;
    };

export interface ApprovalPolicy {
  tools?: Record<string, ToolRule>;
  timeoutSeconds?: number;
  onTimeout?: "deny" | "abort";
  tenants?: Record<string, Omit<ApprovalPolicy, "tenants">>;
}

/** What the policy says of one call; `rule` says which rule decided, in words a person reads. */
export interface ApprovalVerdict {
  mode: ApprovalMode;
  rule: string;
  /** For `ask`: how long the call waits, and what happens then. */
  timeoutMs: number;
  onTimeout: "deny" | "abort";
}

export const DEFAULT_APPROVAL_TIMEOUT_S = 3600;

/**
 * The policy's word on a call of `tool` with `args` in a session of `tenant`. A tool of MCP server
 * `mcpServer` is matched by its name, then `<server>__*`, then `*`; with no rule it asks: its code
 * is nobody's here to review.
 */
export function approvalOf(
  policy: ApprovalPolicy | undefined,
  tenant: string,
  tool: string,
  args: Record<string, unknown>,
  mcpServer?: string,
): ApprovalVerdict {
  const own = policy?.tenants?.[tenant];
  const timeoutMs = 1000 * (own?.timeoutSeconds ?? policy?.timeoutSeconds ?? DEFAULT_APPROVAL_TIMEOUT_S);
  const onTimeout = own?.onTimeout ?? policy?.onTimeout ?? "deny";
  const server = mcpServer !== undefined ? `${mcpServer}__*` : undefined;
  const found = ruleFor(own?.tools, tool, server) ?? ruleFor(policy?.tools, tool, server);
  if (!found && server) return { mode: "ask", rule: "MCP tools ask unless a rule names them", timeoutMs, onTimeout };
  if (!found) return { mode: "allow", rule: "no approval rule names this tool", timeoutMs, onTimeout };
  const { key, rule } = found;
  const where = `${own?.tools?.[key] !== undefined ? `tenant ${tenant}'s` : "the agent's"} rule for ${key}`;
  if (typeof rule === "string") return { mode: rule, rule: `${where}: ${rule}`, timeoutMs, onTimeout };
  if (rule.mode !== "allow" && allowedByArguments(rule, args))
    return { mode: "allow", rule: `${where}: allowed by its argument rules`, timeoutMs, onTimeout };
  const unless =
    rule.mode === "ask" && (rule.allowArguments || rule.allowHosts) ? " (the arguments match no allowed pattern)" : "";
  return { mode: rule.mode, rule: `${where}: ${rule.mode}${unless}`, timeoutMs, onTimeout };
}

function ruleFor(
  tools: Record<string, ToolRule> | undefined,
  tool: string,
  server?: string,
): { key: string; rule: ToolRule } | undefined {
  if (!tools) return undefined;
  if (tools[tool] !== undefined) return { key: tool, rule: tools[tool] };
  if (server && tools[server] !== undefined) return { key: server, rule: tools[server] };
  if (tools["*"] !== undefined) return { key: "*", rule: tools["*"] };
  return undefined;
}

/** Every argument the rule names matches (a pattern in full, or a listed host); a rule naming none allows nothing. */
function allowedByArguments(rule: Exclude<ToolRule, string>, args: Record<string, unknown>): boolean {
  const patterns = Object.entries(rule.allowArguments ?? {});
  const hosts = Object.entries(rule.allowHosts ?? {});
  if (patterns.length + hosts.length === 0) return false;
  for (const [name, list] of patterns) {
    const value = args[name];
    if (typeof value !== "string" || !list.some((p) => fullMatch(p, value))) return false;
  }
  for (const [name, list] of hosts) {
    const host = hostOf(args[name]);
    if (host === undefined || !list.some((h) => hostMatches(h, host))) return false;
  }
  return true;
}

const compiled = new Map<string, RegExp | null>();

/** `pattern` matches all of `value`; a pattern that does not compile matches nothing (the schema check cannot see that). */
function fullMatch(pattern: string, value: string): boolean {
  let re = compiled.get(pattern);
  if (re === undefined) {
    try {
      re = new RegExp(`^(?:${pattern})$`, "s");
    } catch {
      re = null;
    }
    compiled.set(pattern, re);
  }
  return re?.test(value) === true;
}

function hostOf(value: unknown): string | undefined {
  if (typeof value !== "string") return undefined;
  try {
    const url = new URL(value);
    return url.protocol === "http:" || url.protocol === "https:" ? url.hostname.toLowerCase() : undefined;
  } catch {
    return undefined;
  }
}

/** `*.example.com` is any name under example.com (not example.com itself), as agent.json's host lists mean. */
const hostMatches = (listed: string, host: string): boolean =>
  listed.startsWith("*.") ? host.endsWith(listed.slice(1)) : host === listed;

/** Problems with a policy a schema cannot see (patterns that do not compile), for the agent's config check. */
export function policyProblems(policy: ApprovalPolicy | undefined): string[] {
  const out: string[] = [];
  const check = (tools: Record<string, ToolRule> | undefined, where: string) => {
    for (const [tool, rule] of Object.entries(tools ?? {})) {
      if (typeof rule === "string") continue;
      for (const [arg, list] of Object.entries(rule.allowArguments ?? {}))
        for (const p of list) {
          try {
            new RegExp(p);
          } catch (err) {
            out.push(`${where}.tools.${tool}.allowArguments.${arg}: ${(err as Error).message}`);
          }
        }
    }
  };
  check(policy?.tools, "approvals");
  for (const [tenant, own] of Object.entries(policy?.tenants ?? {})) check(own.tools, `approvals.tenants.${tenant}`);
  return out;
}
