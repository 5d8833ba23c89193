// The runner's MCP client (tools/mcp/mcp-connection.ts, over the guarded fetch it uses in the
// runner) as a program the MCP conformance suite drives: `conformance client --command "node
// this.js"` starts a scenario's server and runs this with its URL as the last argument and the
// scenario's name in MCP_CONFORMANCE_SCENARIO. The client connects, lists the tools, and calls
// what the scenario expects a host to call.
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpConnection } from "../../services/runner/tools/mcp/mcp-connection.js";
import { guardedFetch } from "../../services/shared/net/guarded-fetch.js";

const url = new URL(process.argv[process.argv.length - 1]);
// The guard refuses the name localhost outright; the suite's servers listen on every address.
if (url.hostname === "localhost") url.hostname = "127.0.0.1";
const net = { ports: [Number(url.port)], allow: ["127.0.0.1/32"], maxRedirects: 5 };
const fetch = guardedFetch(net, { maxBytes: 10 << 20, headersTimeoutMs: 10_000 });
const connection = new McpConnection("conformance", async () => new StreamableHTTPClientTransport(url, { fetch }), {
  scrub: (t) => t,
});
const ctx = {
  sessionId: "conformance",
  agentId: "conformance",
  toolCallId: "c1",
  signal: new AbortController().signal,
  onUpdate: () => undefined,
};

await connection.ready();
const scenario = process.env.MCP_CONFORMANCE_SCENARIO ?? "";
if (scenario === "tools_call") {
  const result = await connection.call("add_numbers", { a: 5, b: 3 }, ctx);
  console.log(result.output);
  if (result.isError) process.exitCode = 1;
}
await connection.close();
