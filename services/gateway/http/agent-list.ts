// The agents a caller may use over HTTP (the OpenAI endpoint's models, the MCP server's tools):
// the default agent and each folder of the agents directory named as an agent id.
import { readdir } from "node:fs/promises";
import { DEFAULT_AGENT, isAgentId } from "../../shared/ids.js";

/** The agents' ids, sorted; a directory that cannot be read leaves the default alone. */
export async function listAgents(agentsDir: string): Promise<string[]> {
  const agents = new Set([DEFAULT_AGENT]);
  for (const e of await readdir(agentsDir, { withFileTypes: true }).catch(() => []))
    if (e.isDirectory() && isAgentId(e.name)) agents.add(e.name);
  return [...agents].sort();
}
