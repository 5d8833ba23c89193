// MCP both ways through the whole stack. As a client: the reference server
// @modelcontextprotocol/server-everything over Streamable HTTP (its own process, on 127.0.0.2,
// which the runner's policy treats as public through TROUPE_NET_ALLOW), and a misbehaving server
// built here on the SDK's own server classes (it hangs, dies mid-call, lies about its schemas,
// floods progress, answers 11 MB). As a server: the gateway's /mcp, reached with the SDK's client.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { Server as McpServer } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";
import { of } from "./helpers/turn-stack.js";

const require = createRequire(import.meta.url);
const HOST = "127.0.0.2";
let everything: ChildProcess;
let everythingPort = 0;
let bad: Server;
let badPort = 0;
let stack: Stack;
let dataDir = "";
/** The answer the bad server's `die` call is being given: destroyed mid-call. */
let dying: ServerResponse | undefined;

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, HOST, r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

/** A server that does everything wrong, on the SDK's low-level server (one per request, stateless). */
function badServer(): McpServer {
  const server = new McpServer({ name: "bad", version: "1.0.0" }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: [
      { name: "hang", inputSchema: { type: "object" } },
      { name: "die", inputSchema: { type: "object" } },
      { name: "huge", inputSchema: { type: "object" } },
      { name: "flood", inputSchema: { type: "object" } },
      { name: "ok", inputSchema: { type: "object", properties: { n: { type: "integer" } }, required: ["n"] } },
      // Lies: a schema that is no schema, and an output that breaks the schema it promises.
      { name: "broken-schema", inputSchema: { type: "object", properties: { a: { type: "no-such-type" } } } },
      {
        name: "wrong-output",
        inputSchema: { type: "object" },
        outputSchema: { type: "object", properties: { n: { type: "integer" } }, required: ["n"] },
      },
      { name: "has.dot", inputSchema: { type: "object" } },
    ],
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
    const name = req.params.name;
    if (name === "hang") return new Promise(() => undefined);
    if (name === "die") {
      dying?.socket?.destroy();
      return new Promise(() => undefined);
    }
    if (name === "huge") return { content: [{ type: "text", text: "x".repeat(11 * 1024 * 1024) }] };
    if (name === "flood") {
      const token = req.params._meta?.progressToken;
      for (let i = 0; i < 2000 && token !== undefined; i++)
        await extra.sendNotification({
          method: "notifications/progress",
          params: { progressToken: token, progress: i },
        });
      return { content: [{ type: "text", text: "flooded" }] };
    }
    if (name === "wrong-output") return { content: [{ type: "text", text: "{}" }], structuredContent: { n: "many" } };
    return { content: [{ type: "text", text: `ok ${JSON.stringify(req.params.arguments)}` }] };
  });
  return server;
}

async function serveBad(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const body = chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
  if (JSON.stringify(body ?? "").includes('"die"')) dying = res;
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
  await badServer().connect(transport);
  await transport.handleRequest(req, res, body);
}

before(async () => {
  everythingPort = await freePort();
  everything = spawn(
    process.execPath,
    [require.resolve("@modelcontextprotocol/server-everything/dist/index.js"), "streamableHttp"],
    { env: { ...process.env, PORT: String(everythingPort) }, stdio: ["ignore", "ignore", "pipe"] },
  );
  let said = "";
  everything.stderr?.on("data", (d) => (said += d));
  await waitFor("server-everything listening", async () => said.includes("listening"));
  bad = createServer((req, res) => void serveBad(req, res).catch(() => res.destroy()));
  await new Promise<void>((r) => bad.listen(0, HOST, r));
  badPort = (bad.address() as AddressInfo).port;

  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-mcp-"));
  const url = (port: number) => `http://${HOST}:${port}/mcp`;
  await writeAgent(dataDir, "tools", {
    mcpServers: { everything: { url: url(everythingPort) }, bad: { url: url(badPort), timeoutSeconds: 3 } },
    mcpTenants: { acme: { bad: null } },
    approvals: { tools: { "everything__*": "allow", bad__ok: "allow", "bad__*": "allow" } },
  });
  // No rule names its tools: they ask.
  await writeAgent(dataDir, "asks", { mcpServers: { everything: { url: url(everythingPort) } } });
  // The loopback address the policy does not allow, and a redirect there.
  await writeAgent(dataDir, "private", {
    mcpServers: { local: { url: `http://127.0.0.1:${everythingPort}/mcp` } },
    approvals: { tools: { "*": "allow" } },
  });
  stack = await startStack({
    dataDir,
    env: {
      TROUPE_SANDBOX_POOL: "0",
      TROUPE_NET_ALLOW: `${HOST}/32`,
      TROUPE_NET_PORTS: `80,443,${everythingPort},${badPort}`,
      TROUPE_MEMORY_LEARN: "0",
    },
  });
});

after(async () => {
  await stack?.stop();
  everything?.kill();
  bad?.closeAllConnections();
  bad?.close();
  await rm(dataDir, { recursive: true, force: true });
});

async function open(agentId: string, client = stack.gateway): Promise<ChatSession> {
  const s = new ChatSession(client);
  s.send({ case: "open", value: { sessionId: "", agentId, create: true } });
  await s.waitOpened();
  return s;
}

const call = async (s: ChatSession, line: string, timeoutMs = 30_000) => {
  const events = await s.turn(`!call ${line}`, timeoutMs);
  const ends = of(events, "toolExecutionEnd");
  assert.equal(ends.length, 1, `${line}: ${JSON.stringify(of(events, "error"))}`);
  return { end: ends[0], events };
};

describe("MCP servers as an agent's tools", () => {
  test("server-everything over Streamable HTTP: text, structured content, images, progress, schemas", async () => {
    const s = await open("tools");
    const echo = await call(s, 'everything__echo {"message": "hello mcp"}');
    assert.equal(echo.end.isError, false, echo.end.result);
    assert.equal(echo.end.result, "Echo: hello mcp");
    const sum = await call(s, 'everything__get-sum {"a": 2, "b": 40}');
    assert.match(sum.end.result, /is 42\./);
    const structured = await call(s, 'everything__get-structured-content {"location": "Chicago"}');
    assert.match(structured.end.result, /"temperature":/);
    const image = await call(s, "everything__get-tiny-image {}");
    assert.match(image.end.result, /\[image image\/png, \d+ bytes, not shown\]/);
    const long = await call(s, 'everything__trigger-long-running-operation {"duration": 1, "steps": 3}');
    const updates = of(long.events, "toolExecutionUpdate").map((u) => u.output);
    assert.ok(
      updates.some((u) => u.includes("[progress 3/3]")),
      JSON.stringify(updates),
    );
    // Arguments off the server's schema never reach it.
    const wrong = await call(s, 'everything__get-sum {"a": "two", "b": 40}');
    assert.equal(wrong.end.isError, true);
    assert.match(wrong.end.result, /do not match its schema/);
    s.close();
  });

  test("an MCP tool no approval rule names waits for a person", async () => {
    const s = await open("asks");
    s.prompt('!call everything__echo {"message": "may I?"}');
    const asked = await s.waitFor((e) => e.payload.case === "toolApprovalRequested", 30_000);
    assert.equal(asked.payload.case === "toolApprovalRequested" && asked.payload.value.toolName, "everything__echo");
    assert.match(
      asked.payload.case === "toolApprovalRequested" ? asked.payload.value.rule : "",
      /MCP tools ask unless a rule names them/,
    );
    s.close();
  });

  test("a bad server costs one call, not the session", async () => {
    const s = await open("tools");
    const hang = await call(s, "bad__hang {}");
    assert.equal(hang.end.isError, true);
    assert.match(hang.end.result, /bad__hang failed: .*timed out/i);
    const die = await call(s, "bad__die {}");
    assert.equal(die.end.isError, true, die.end.result);
    const huge = await call(s, "bad__huge {}");
    assert.equal(huge.end.isError, true);
    assert.match(huge.end.result, /over 10 MB|passed \d+ bytes/);
    const flood = await call(s, "bad__flood {}");
    assert.equal(flood.end.result, "flooded");
    assert.ok(of(flood.events, "toolExecutionUpdate").length <= 30, "progress is thinned");
    const output = await call(s, "bad__wrong-output {}");
    assert.equal(output.end.isError, true);
    assert.match(output.end.result, /structured content does not match|output schema/i);
    // Tools whose schema or name cannot be used are not offered.
    for (const refused of ["bad__broken-schema", "bad__has.dot"]) {
      const r = await call(s, `${refused} {}`);
      assert.match(r.end.result, /not found/, refused);
    }
    // And the session goes on, the server's good tool working.
    const ok = await call(s, 'bad__ok {"n": 7}');
    assert.equal(ok.end.result, 'ok {"n":7}');
    s.close();
  });

  test("a private address is refused; another tenant does not see the first one's servers", async () => {
    const s = await open("private");
    const events = await s.turn('!call local__echo {"message": "x"}', 30_000);
    const errors = of(events, "error").map((e) => e.message);
    assert.ok(
      errors.some((m) => /MCP server local offers no tools.*127\.0\.0\.1 is not a public address/.test(m)),
      JSON.stringify(errors),
    );
    assert.match(of(events, "toolExecutionEnd")[0].result, /not found/);
    s.close();
    // Tenant acme's sessions of the same agent have no `bad` server (mcpTenants removes it).
    const acme = await open("tools", await stack.gatewayAs("acme", "ann"));
    const r = await call(acme, 'bad__ok {"n": 1}');
    assert.match(r.end.result, /not found/);
    const echo = await call(acme, 'everything__echo {"message": "acme"}');
    assert.equal(echo.end.result, "Echo: acme");
    acme.close();
  });
});
