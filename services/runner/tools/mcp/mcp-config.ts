// The MCP servers an agent's runs use (agent.json "mcpServers"), and a tenant's own
// ("mcpTenants": a server a tenant names replaces the agent's of that name; null removes it).
//
//   "mcpServers": {
//     "github": { "url": "https://api.githubcopilot.com/mcp/",
//                 "headers": { "authorization": "Bearer {{secret:GITHUB_TOKEN}}" } },
//     "files": { "command": "mcp-server-filesystem", "args": ["/workspace"] }
//   },
//   "mcpTenants": { "acme": { "github": { "url": "https://mcp.acme.example/mcp" }, "files": null } }
//
// A `url` server is reached over Streamable HTTP through the SSRF guard; a `command` server runs
// in the session's sandbox and is spoken to over its stdio. `{{secret:NAME}}` in a header (or,
// for a command, an env value) is filled from the runner's secrets file and never reaches the model.

export interface McpServerSpec {
  /** Streamable HTTP endpoint. */
  url?: string;
  headers?: Record<string, string>;
  /** A program in the sandbox image, with its arguments and environment. */
  command?: string;
  args?: string[];
  env?: Record<string, string>;
  /** One call's deadline, progress restarting it up to four times over (default 60). */
  timeoutSeconds?: number;
}

export type McpServers = Record<string, McpServerSpec>;

/** What a server's name may be: it prefixes its tools' names (`<server>__<tool>`). */
export const SERVER_NAME = /^[A-Za-z0-9-]{1,32}$/;

/** The servers a session of `tenant` uses: the agent's, with the tenant's replacing or removing by name. */
export function serversFor(
  agent: { mcpServers?: McpServers; mcpTenants?: Record<string, Record<string, McpServerSpec | null>> },
  tenant: string,
): McpServers {
  const out: McpServers = { ...agent.mcpServers };
  for (const [name, spec] of Object.entries(agent.mcpTenants?.[tenant] ?? {})) {
    if (spec === null) delete out[name];
    else out[name] = spec;
  }
  return out;
}

const SECRET_REF = /\{\{secret:([A-Z][A-Z0-9_]{0,63})\}\}/g;

/** `text` with each {{secret:NAME}} filled in from `secrets`; throws naming a secret that is missing. */
export function fillSecrets(text: string, secrets: Record<string, string>, server: string): string {
  return text.replace(SECRET_REF, (_, name: string) => {
    const value = secrets[name];
    if (value === undefined) throw new Error(`MCP server ${server}: secret ${name} is not configured on this runner`);
    return value;
  });
}

/** The secrets a spec names, for scrubbing them from what the server sends back. */
export function secretsNamed(spec: McpServerSpec, secrets: Record<string, string>): [string, string][] {
  const text = JSON.stringify([spec.headers ?? {}, spec.env ?? {}]);
  const names = new Set([...text.matchAll(SECRET_REF)].map((m) => m[1]));
  return [...names].flatMap((n) => (secrets[n] !== undefined ? [[n, secrets[n]] as [string, string]] : []));
}

/** Problems the schema does not say: a server of both kinds or neither, a url that does not parse. */
export function serverProblems(servers: McpServers | undefined, where: string): string[] {
  const out: string[] = [];
  for (const [name, spec] of Object.entries(servers ?? {})) {
    if ((spec.url === undefined) === (spec.command === undefined))
      out.push(`${where}.${name}: give either "url" (Streamable HTTP) or "command" (stdio in the sandbox)`);
    else if (spec.url !== undefined && !URL.canParse(spec.url)) out.push(`${where}.${name}.url: not a URL`);
    if (spec.url !== undefined && (spec.args || spec.env))
      out.push(`${where}.${name}: "args" and "env" are for a command, not a url`);
    if (spec.command !== undefined && spec.headers)
      out.push(`${where}.${name}: "headers" are for a url, not a command`);
  }
  return out;
}
