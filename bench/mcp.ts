// bench/mcp: what a tool call costs through an MCP server, beside the built-in tool of the same
// kind in the same run, through the whole stack (gateway, runner, sandbox; scripted model):
//
// - stdio: server-everything's `echo` run over stdio in the session's sandbox (the MCP image)
//   against the built-in `exec` running `echo` in the same sandbox (both cross the sandbox's
//   channel once per call);
// - http: server-everything's `echo` over Streamable HTTP (its own process, on 127.0.0.2,
//   through the SSRF guard) against the built-in `web_fetch` of a page on 127.0.0.2 (both one
//   guarded HTTP exchange per call);
// - setup: a new session's agent_start -> first turn_start, for an agent with one MCP server of
//   each kind (the connection made, tools listed) against one with none. The stdio case includes
//   starting the server's process in a warm sandbox from the pool.
//
// A call's time is its tool_execution_start -> tool_execution_end as the client receives them;
// one call per turn (a batch of read-only calls would run at once, and each call's time would
// include the others'), one session per kind, after 20 warm-up calls. The floor is
// the MCP SDK's own client calling the same server directly in the same run, with the global
// fetch over HTTP and spawning it on this host over stdio: what the server itself costs.
//
//   node dist/bench/mcp.js [--calls 500] [--sessions 20]
import { spawn } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";
import type { AgentEvent } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "../test/helpers/session.js";
import { LOAD_QUOTAS, startStack, waitFor, writeAgent, type Stack } from "../test/helpers/stack.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: { calls: { type: "string", default: "500" }, sessions: { type: "string", default: "20" } },
});
const CALLS = Number(values.calls);
const SESSIONS = Number(values.sessions);
const HOST = "127.0.0.2";
const require = createRequire(import.meta.url);

const freePort = async () => {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, HOST, r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
};

/** A session whose events are stamped with their arrival time. */
async function session(stack: Stack, agentId: string) {
  const s = new ChatSession(stack.gateway);
  const arrived = new Map<AgentEvent, number>();
  s.call.on("data", (resp: { kind: { case: string; value: AgentEvent } }) => {
    if (resp.kind.case === "event") arrived.set(resp.kind.value, performance.now());
  });
  s.send({ case: "open", value: { sessionId: "", agentId, create: true } });
  await s.waitOpened(60_000);
  return { s, at: (e: AgentEvent) => arrived.get(e) ?? Number.NaN };
}

/** ms of each of `n` calls of `line`, one `!call` per turn. */
async function callTimes(stack: Stack, agentId: string, line: string, n: number, warm = 20): Promise<number[]> {
  const { s, at } = await session(stack, agentId);
  const times: number[] = [];
  for (let done = 0; done < n + warm; done++) {
    const events = await s.turn(`!call ${line}`, 120_000);
    const starts = new Map<string, number>();
    for (const e of events) {
      const p = e.payload;
      if (p.case === "toolExecutionStart") starts.set(p.value.toolCallId, at(e));
      else if (p.case === "toolExecutionEnd") {
        if (p.value.isError) throw new Error(`${line}: ${p.value.result}`);
        if (done >= warm) times.push(at(e) - (starts.get(p.value.toolCallId) ?? Number.NaN));
      }
    }
  }
  s.close();
  return times;
}

/** agent_start -> first turn_start of `count` new sessions of `agentId`, one at a time. */
async function setupTimes(stack: Stack, agentId: string, count: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < count; i++) {
    const { s, at } = await session(stack, agentId);
    const events = await s.turn("hello", 120_000);
    const start = events.find((e) => e.payload.case === "agentStart");
    const turn = events.find((e) => e.payload.case === "turnStart");
    if (!start || !turn) throw new Error(`${agentId}: no agent_start or turn_start`);
    out.push(at(turn) - at(start));
    s.close();
    await stack.gateway.deleteSession({ sessionId: s.opened!.sessionId });
  }
  return out;
}

/** ms of each of `n` echo calls by the SDK's own client on `transport`, after 20 warm-up calls. */
async function floorTimes(transport: Transport, n: number): Promise<number[]> {
  const client = new Client({ name: "floor", version: "1" });
  await client.connect(transport);
  const times: number[] = [];
  for (let i = 0; i < n + 20; i++) {
    const t = performance.now();
    await client.callTool({ name: "echo", arguments: { message: "hi" } });
    if (i >= 20) times.push(performance.now() - t);
  }
  await client.close();
  return times;
}

const everythingPort = await freePort();
const everything = spawn(
  process.execPath,
  [require.resolve("@modelcontextprotocol/server-everything/dist/index.js"), "streamableHttp"],
  { env: { ...process.env, PORT: String(everythingPort) }, stdio: ["ignore", "ignore", "pipe"] },
);
let said = "";
everything.stderr?.on("data", (d) => (said += d));
const page = createServer((_req, res) => res.writeHead(200, { "content-type": "text/plain" }).end("Echo: hi"));
await new Promise<void>((r) => page.listen(0, HOST, r));
const pagePort = (page.address() as AddressInfo).port;

const stack = await startStack({
  env: {
    ...LOAD_QUOTAS,
    TROUPE_LOG_LEVEL: "warn",
    TROUPE_MEMORY_CONTEXT_K: "0",
    TROUPE_MEMORY_LEARN: "0",
    TROUPE_SANDBOX_IMAGE: "troupe-sandbox:mcp",
    // One prompt per call, back to back: past the default 20 a second of one session.
    TROUPE_SESSION_RATE: "1000",
    TROUPE_NET_ALLOW: `${HOST}/32`,
    TROUPE_NET_PORTS: `80,443,${everythingPort},${pagePort}`,
  },
});
try {
  await waitFor("server-everything listening", async () => said.includes("listening"));
  const url = `http://${HOST}:${everythingPort}/mcp`;
  const allow = { approvals: { tools: { "*": "allow" } } };
  await writeAgent(stack.dataDir, "mcp-stdio", {
    ...allow,
    mcpServers: { ev: { command: "mcp-server-everything", args: ["stdio"] } },
  });
  await writeAgent(stack.dataDir, "mcp-http", { ...allow, mcpServers: { ev: { url } } });
  await writeAgent(stack.dataDir, "plain", allow);

  const echo = 'ev__echo {"message": "hi"}';
  const stdio = await callTimes(stack, "mcp-stdio", echo, CALLS);
  const exec = await callTimes(stack, "plain", 'exec {"command": "echo hi"}', CALLS);
  const http = await callTimes(stack, "mcp-http", echo, CALLS);
  const fetch = await callTimes(stack, "plain", `web_fetch {"url": "http://${HOST}:${pagePort}/"}`, CALLS);
  const floorHttp = await floorTimes(new StreamableHTTPClientTransport(new URL(url)), CALLS);
  const floorStdio = await floorTimes(
    new StdioClientTransport({
      command: process.execPath,
      args: [require.resolve("@modelcontextprotocol/server-everything/dist/index.js"), "stdio"],
      stderr: "ignore",
    }),
    CALLS,
  );
  const setupPlain = await setupTimes(stack, "plain", SESSIONS);
  const setupHttp = await setupTimes(stack, "mcp-http", SESSIONS);
  const setupStdio = await setupTimes(stack, "mcp-stdio", SESSIONS);

  const f = (xs: number[]) => `p50 ${pct(xs, 50).toFixed(2)} ms, p99 ${pct(xs, 99).toFixed(2)} ms`;
  console.log(
    `stdio MCP echo (sandbox): ${f(stdio)}; built-in exec echo (baseline): ${f(exec)}; SDK client spawning the server (floor): ${f(floorStdio)}`,
  );
  console.log(
    `HTTP MCP echo: ${f(http)}; built-in web_fetch (baseline): ${f(fetch)}; SDK client with fetch (floor): ${f(floorHttp)}`,
  );
  console.log(
    `session set-up (agent_start -> turn_start): none ${f(setupPlain)}; HTTP ${f(setupHttp)}; stdio ${f(setupStdio)}`,
  );
  const r = (a: number[], b: number[]) => (pct(a, 50) / pct(b, 50)).toFixed(2);
  console.log(
    `RESULT calls=${stdio.length} stdio_p50_ms=${pct(stdio, 50).toFixed(2)} stdio_p99_ms=${pct(stdio, 99).toFixed(2)} exec_p50_ms=${pct(exec, 50).toFixed(2)} stdio_ratio=${r(stdio, exec)} stdio_floor_p50_ms=${pct(floorStdio, 50).toFixed(2)} http_p50_ms=${pct(http, 50).toFixed(2)} http_p99_ms=${pct(http, 99).toFixed(2)} web_fetch_p50_ms=${pct(fetch, 50).toFixed(2)} http_ratio=${r(http, fetch)} http_floor_p50_ms=${pct(floorHttp, 50).toFixed(2)} setup_none_p50_ms=${pct(setupPlain, 50).toFixed(1)} setup_http_p50_ms=${pct(setupHttp, 50).toFixed(1)} setup_stdio_p50_ms=${pct(setupStdio, 50).toFixed(1)}`,
  );
} finally {
  await stack.stop();
  everything.kill();
  page.close();
}
