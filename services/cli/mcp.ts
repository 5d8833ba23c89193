// `troupe mcp ls --agent NAME [--session ID]`: the MCP servers an agent's runs use for the
// caller's tenant (agent.json mcpServers), each with its state and tools, as the runner sees them.
// With --session, that session's own connections; else the servers are connected for the asking
// (stdio servers in a sandbox made for it and removed after).
import { McpServerStatusSchema } from "../shared/gen/troupe/v1/session_pb.js";
import { jsonLine, UsageError, withGateway } from "./sessions.js";
import { printTable } from "./table.js";

export function mcpCommand(args: string[]): Promise<number> {
  const [, ...rest] = args;
  const extra = { agent: { type: "string" }, session: { type: "string" } } as const;
  return withGateway(rest, extra, async (gw, _words, flags) => {
    const agentId = typeof flags.agent === "string" ? flags.agent : "";
    const sessionId = typeof flags.session === "string" ? flags.session : "";
    if (agentId === "" && sessionId === "") throw new UsageError("--agent NAME (or --session ID) is missing");
    const { servers } = await gw.listMcpServers({ agentId, sessionId }, { timeoutMs: 120_000 });
    if (flags.json) for (const s of servers) jsonLine(McpServerStatusSchema, s);
    else if (servers.length === 0) process.stdout.write("no MCP servers (agent.json mcpServers)\n");
    else {
      printTable(
        ["SERVER", "TRANSPORT", "STATE", "TOOLS", "ERROR"],
        servers.map((s) => [
          s.name,
          s.transport,
          s.state,
          String(s.tools.filter((t) => t.refused === "").length),
          s.error.slice(0, 120) || "-",
        ]),
      );
      for (const s of servers)
        for (const t of s.tools)
          process.stdout.write(`  ${t.name}${t.refused ? ` (not offered: ${t.refused})` : ""}\n`);
    }
    // Exit 1 when a server cannot be used, so a script can check a configuration.
    return servers.some((s) => s.state !== "ready") ? 1 : 0;
  });
}
