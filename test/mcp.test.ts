// MCP both ways through the whole stack. As a client: the reference server
// @modelcontextprotocol/server-everything over Streamable HTTP (its own process, on 127.0.0.2,
// which the runner's policy treats as public through TROUPE_NET_ALLOW), and a misbehaving server
// built here on the SDK's own server classes (it hangs, dies mid-call, lies about its schemas,
// floods progress, answers 11 MB). As a server: the gateway's /mcp, reached with the SDK's client.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { request } from "node:http";
import { promisify } from "node:util";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { Server as McpServer } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ChatSession } from "./helpers/session.js";
import { MAIN, startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";
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
/** The bad server's `grow` was called: it lists one more tool, and said so. */
let grown = false;

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, HOST, r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

/** A server that does everything wrong, on the SDK's low-level server (one per request, stateless). */
function badServer(authorization = ""): McpServer {
  const server = new McpServer({ name: "bad", version: "1.0.0" }, { capabilities: { tools: { listChanged: true } } });
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
      { name: "grow", inputSchema: { type: "object" } },
      { name: "whoami", inputSchema: { type: "object" } },
      ...(grown ? [{ name: "grown", inputSchema: { type: "object" } }] : []),
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
    if (name === "whoami") return { content: [{ type: "text", text: `you sent ${authorization}` }] };
    if (name === "grow") {
      grown = true;
      await extra.sendNotification({ method: "notifications/tools/list_changed" });
      return { content: [{ type: "text", text: "grew" }] };
    }
    if (name === "wrong-output") return { content: [{ type: "text", text: "{}" }], structuredContent: { n: "many" } };
    return { content: [{ type: "text", text: `ok ${JSON.stringify(req.params.arguments)}` }] };
  });
  return server;
}

/** The Authorization headers the bad server was sent, by path. */
const seenAuthorization: string[] = [];
const BAD_TOKEN = "bad-server-token-7f3a91";

async function serveBad(req: IncomingMessage, res: ServerResponse): Promise<void> {
  seenAuthorization.push(`${req.url} ${req.headers.authorization ?? "-"}`);
  // A redirect to this machine's loopback (which the runner's policy does not allow).
  if (req.url === "/redirect") {
    req.resume();
    return void res.writeHead(307, { location: `http://127.0.0.1:${badPort}/mcp` }).end();
  }
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const body = chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
  if (JSON.stringify(body ?? "").includes('"die"')) dying = res;
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
  await badServer(String(req.headers.authorization ?? "")).connect(transport);
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
    mcpServers: {
      everything: { url: url(everythingPort) },
      bad: { url: url(badPort), timeoutSeconds: 3, headers: { authorization: "Bearer {{secret:BAD_TOKEN}}" } },
    },
    mcpTenants: { acme: { bad: null } },
    approvals: { tools: { "everything__*": "allow", bad__ok: "allow", "bad__*": "allow" } },
  });
  // One server name, two tenants, two servers: acme's `everything` is the bad server.
  await writeAgent(dataDir, "same-name", {
    mcpServers: { everything: { url: url(everythingPort) } },
    mcpTenants: { acme: { everything: { url: url(badPort) } } },
    approvals: { tools: { "*": "allow" } },
  });
  // Reference servers over stdio, run in the session's sandbox (the MCP image has them).
  await writeAgent(dataDir, "stdio", {
    mcpServers: {
      everything: { command: "mcp-server-everything", args: ["stdio"] },
      files: { command: "mcp-server-filesystem", args: ["/workspace"] },
      missing: { command: "no-such-mcp-server" },
    },
    approvals: { tools: { "*": "allow" } },
  });
  // No rule names its tools: they ask.
  await writeAgent(dataDir, "asks", { mcpServers: { everything: { url: url(everythingPort) } } });
  // The loopback address the policy does not allow, and a redirect there.
  await writeAgent(dataDir, "private", {
    mcpServers: {
      local: { url: `http://127.0.0.1:${everythingPort}/mcp` },
      hop: { url: `http://${HOST}:${badPort}/redirect`, headers: { authorization: "Bearer {{secret:BAD_TOKEN}}" } },
    },
    approvals: { tools: { "*": "allow" } },
  });
  await writeFile(path.join(dataDir, "secrets.json"), JSON.stringify({ BAD_TOKEN }));
  stack = await startStack({
    dataDir,
    env: {
      TROUPE_SANDBOX_POOL: "0",
      // Debian's Node.js with the reference servers (make sandbox-image-mcp).
      TROUPE_SANDBOX_IMAGE: "troupe-sandbox:mcp",
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
    assert.match(image.end.result, /\[image image\/png, \d+ bytes\]/);
    // The image itself is kept with the result, for a vision model (the next request carries it).
    const kept = await stack.gateway.getHistory({ sessionId: s.opened!.sessionId, pageSize: 1000 });
    const result = kept.messages.find((m) => m.toolName === "everything__get-tiny-image" && m.role === Role.TOOL);
    assert.equal(result?.images[0]?.mimeType, "image/png");
    const long = await call(s, 'everything__trigger-long-running-operation {"duration": 1, "steps": 3}');
    const updates = of(long.events, "toolExecutionUpdate").map((u) => u.output);
    assert.ok(
      updates.some((u) => u.includes("[progress 3/3]")),
      JSON.stringify(updates),
    );
    // An abort mid-call cancels it at the server (notifications/cancelled) and ends the run.
    const from = s.events.length;
    s.prompt('!call everything__trigger-long-running-operation {"duration": 30, "steps": 30}');
    await s.waitFor((e) => e.payload.case === "toolExecutionUpdate", 15_000, from);
    const abortedAt = Date.now();
    s.send({ case: "abort", value: { reason: "enough" } });
    const ended = await s.waitFor((e) => e.payload.case === "toolExecutionEnd", 10_000, from);
    assert.equal(ended.payload.case === "toolExecutionEnd" && ended.payload.value.isError, true);
    assert.ok(Date.now() - abortedAt < 5000, "the call ended at the abort, not at the operation's end");
    await s.waitFor((e) => e.payload.case === "agentEnd", 10_000, from);
    // Arguments off the server's schema never reach it.
    const wrong = await call(s, 'everything__get-sum {"a": "two", "b": 40}');
    assert.equal(wrong.end.isError, true);
    assert.match(wrong.end.result, /do not match its schema/);
    s.close();
  });

  test("stdio servers run in the session's sandbox: server-everything and server-filesystem", async () => {
    const s = await open("stdio");
    const first = await s.turn('!call everything__echo {"message": "from the sandbox"}', 60_000);
    assert.equal(
      of(first, "toolExecutionEnd")[0]?.result,
      "Echo: from the sandbox",
      JSON.stringify(of(first, "error")),
    );
    // A server that cannot start costs its own tools, said once per run, and nothing else.
    const said = of(first, "error").map((e) => e.message);
    assert.ok(
      said.some((m) => /MCP server missing offers no tools.*no-such-mcp-server/.test(m)),
      JSON.stringify(said),
    );
    // Structured content, images and progress come through the sandbox's channel as over HTTP.
    assert.match(
      (await call(s, 'everything__get-structured-content {"location": "Chicago"}')).end.result,
      /"temperature":/,
    );
    assert.match((await call(s, "everything__get-tiny-image {}")).end.result, /\[image image\/png, \d+ bytes\]/);
    const long = await call(s, 'everything__trigger-long-running-operation {"duration": 1, "steps": 2}');
    // Its last progress comes in the same chunk as its result, and is still seen.
    const progress = of(long.events, "toolExecutionUpdate").map((u) => u.output);
    assert.ok(
      progress.some((u) => u.includes("[progress 2/2]")),
      progress.join(""),
    );
    // The server's environment is the sandbox's: no runner variable reached it.
    const env = await call(s, "everything__get-env {}");
    assert.match(env.end.result, /"PATH"/);
    assert.doesNotMatch(env.end.result, /TROUPE_/);
    // The filesystem server writes the workspace the agent's own tools see.
    assert.equal((await call(s, 'files__create_directory {"path": "/workspace/notes"}')).end.isError, false);
    const wrote = await call(s, 'files__write_file {"path": "/workspace/notes/plan.txt", "content": "step one"}');
    assert.equal(wrote.end.isError, false, wrote.end.result);
    assert.match((await call(s, 'exec {"command": "cat /workspace/notes/plan.txt"}')).end.result, /step one/);
    const listed = await call(s, 'files__list_directory {"path": "/workspace/notes"}');
    assert.match(listed.end.result, /\[FILE\] plan\.txt/);
    // Outside its allowed directory, the server itself refuses.
    const outside = await call(s, 'files__read_text_file {"path": "/etc/passwd"}');
    assert.equal(outside.end.isError, true);
    // A server killed in the sandbox is started again on a later call (only a node process is
    // looked at: the shell's own command line names the server too).
    const killed = await call(
      s,
      'exec {"command": "for p in /proc/[0-9]*; do case $(head -c 4 $p/cmdline 2>/dev/null) in node) grep -qa server-everything $p/cmdline && kill $(basename $p) && echo KILLED;; esac; done; true"}',
    );
    assert.match(killed.end.result, /KILLED/);
    await waitFor(
      "server-everything started again",
      async () => /Echo: again/.test((await call(s, 'everything__echo {"message": "again"}', 60_000)).end.result),
      30_000,
    );
    s.close();
    await stack.gateway.deleteSession({ sessionId: s.opened!.sessionId });
  });

  test("troupe mcp ls: each server, its state and its tools; a session's own connections", async () => {
    const mcpLs = async (...args: string[]) => {
      try {
        const { stdout } = await promisify(execFile)(
          process.execPath,
          [MAIN, "mcp", "ls", "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway, ...args],
          { encoding: "utf8", timeout: 120_000 },
        );
        return { code: 0, stdout };
      } catch (err) {
        return { code: (err as { code: number }).code, stdout: (err as { stdout: string }).stdout };
      }
    };
    // The stdio servers are connected for the asking, in a sandbox made for it and removed after.
    const probe = await mcpLs("--agent", "stdio");
    assert.equal(probe.code, 1, "a server that cannot start makes it exit 1");
    assert.match(probe.stdout, /^everything +stdio +ready +1\d /m);
    assert.match(probe.stdout, /^files +stdio +ready +1\d /m);
    assert.match(probe.stdout, /^missing +stdio +failed +0 +cannot connect: .*no-such-mcp-server/m);
    assert.match(probe.stdout, /^ {2}files__read_text_file$/m);
    await waitFor(
      "the probe's sandbox removed",
      async () =>
        !(await stack.client(SandboxService, stack.addr.sandbox).listSandboxes({})).sandboxes.some((s) =>
          s.scopeKey.includes("mcp-probe-"),
        ),
    );
    // The bad server's unusable tools are listed, and said why.
    const http = await mcpLs("--agent", "tools", "--json");
    const bad = http.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { name: string; tools: { name: string; refused?: string }[] })
      .find((s) => s.name === "bad");
    assert.match(bad?.tools.find((t) => t.name === "bad__broken-schema")?.refused ?? "", /not a schema/);
    assert.equal(http.code, 0, http.stdout);
    // A session's own connections, as its runs use them.
    const s = await open("tools");
    await call(s, 'everything__echo {"message": "hi"}');
    const own = await mcpLs("--session", s.opened!.sessionId);
    assert.match(own.stdout, /^everything +http +ready /m);
    const foreign = await mcpLs("--session", "nobody-has-this-one");
    assert.equal(foreign.code, 1);
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
    // A tool the server adds, saying so (notifications/tools/list_changed), is offered next run.
    assert.equal((await call(s, "bad__grow {}")).end.result, "grew");
    await waitFor("bad__grown offered", async () => /^ok/.test((await call(s, "bad__grown {}")).end.result));
    // The credential comes from the secrets file; the model never sees it, even echoed back.
    const whoami = await call(s, "bad__whoami {}");
    assert.equal(whoami.end.result, "you sent Bearer [secret BAD_TOKEN]");
    assert.ok(seenAuthorization.some((a) => a === `/mcp Bearer ${BAD_TOKEN}`));
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
    // A redirect to a private address is refused too: nothing is sent there.
    assert.ok(
      errors.some((m) => /MCP server hop offers no tools.*127\.0\.0\.1 is not a public address/.test(m)),
      JSON.stringify(errors),
    );
    s.close();
    // Tenant acme's sessions of the same agent have no `bad` server (mcpTenants removes it).
    const acme = await open("tools", await stack.gatewayAs("acme", "ann"));
    const r = await call(acme, 'bad__ok {"n": 1}');
    assert.match(r.end.result, /not found/);
    const echo = await call(acme, 'everything__echo {"message": "acme"}');
    assert.equal(echo.end.result, "Echo: acme");
    acme.close();
  });

  test("two owners' sessions of one id hold their own connections", async () => {
    // Session ids are the clients' to choose: dev's and acme's "same-id" are two sessions.
    const mine = new ChatSession(stack.gateway);
    mine.send({ case: "open", value: { sessionId: "same-id", agentId: "same-name", create: true } });
    await mine.waitOpened();
    const from = mine.events.length;
    mine.prompt('!call everything__trigger-long-running-operation {"duration": 3, "steps": 6}');
    await mine.waitFor((e) => e.payload.case === "toolExecutionUpdate", 15_000, from);
    // Meanwhile acme's session of that id runs its own server under the same name.
    const theirs = new ChatSession(await stack.gatewayAs("acme", "ann"));
    theirs.send({ case: "open", value: { sessionId: "same-id", agentId: "same-name", create: true } });
    await theirs.waitOpened();
    assert.equal((await call(theirs, 'everything__ok {"n": 2}')).end.result, 'ok {"n":2}');
    // Dev's call, on dev's connection, ends as its server says: nothing of acme's touched it.
    const ended = await mine.waitFor((e) => e.payload.case === "toolExecutionEnd", 15_000, from);
    assert.match(
      ended.payload.case === "toolExecutionEnd" ? ended.payload.value.result : "",
      /Long running operation completed/,
    );
    mine.close();
    theirs.close();
  });
});

/** The SDK's own client on the gateway's /mcp, with `key` as its Bearer credential. */
async function mcpClient(key: string): Promise<Client> {
  const client = new Client({ name: "troupe-test-host", version: "1.0.0" });
  await client.connect(
    new StreamableHTTPClientTransport(new URL(`http://${stack.addr.http}/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${key}` } },
    }),
  );
  return client;
}

const textOf = (r: Awaited<ReturnType<Client["callTool"]>>) =>
  (r.content as { type: string; text?: string }[]).map((c) => c.text ?? "").join("");

describe("Troupe's agents as an MCP server at /mcp", () => {
  test("an MCP host lists the agents, talks to one, continues its session, and reads it", async () => {
    const client = await mcpClient(stack.apiKey);
    const tools = (await client.listTools()).tools.map((t) => t.name);
    for (const agent of ["main", "tools", "asks", "private"]) assert.ok(tools.includes(agent), `${agent} in ${tools}`);
    const first = await client.callTool({ name: "main", arguments: { prompt: "hello there" } });
    assert.equal(first.isError, false, textOf(first));
    assert.equal(textOf(first), "You said: hello there");
    const session = (first.structuredContent as { session: string }).session;
    assert.ok(session);
    const second = await client.callTool({ name: "main", arguments: { prompt: "and again", session } });
    assert.equal((second.structuredContent as { session: string }).session, session);
    const resources = (await client.listResources()).resources;
    const mine = resources.find((r) => r.name === session);
    assert.ok(mine, JSON.stringify(resources));
    const read = await client.readResource({ uri: mine.uri });
    const transcript = (read.contents[0] as { text: string }).text;
    assert.match(transcript, /user: hello there[\s\S]*assistant: You said: hello there[\s\S]*user: and again/);
    // Bad input is the protocol's error, not a run.
    await assert.rejects(
      client.callTool({ name: "no-such-agent", arguments: { prompt: "x" } }),
      /no agent no-such-agent/,
    );
    await assert.rejects(client.callTool({ name: "main", arguments: {} }), /prompt/);
    await client.close();
  });

  test("progress while a run goes; a cancelled request aborts its run", async () => {
    const client = await mcpClient(stack.apiKey);
    const seen: string[] = [];
    const r = await client.callTool(
      { name: "tools", arguments: { prompt: '!call everything__echo {"message": "via mcp"}' } },
      undefined,
      { onprogress: (p) => seen.push(p.message ?? "") },
    );
    assert.match(textOf(r), /Echo: via mcp/);
    assert.ok(
      seen.includes("everything__echo running") && seen.includes("everything__echo done"),
      JSON.stringify(seen),
    );
    const stop = new AbortController();
    const slow = client.callTool({ name: "main", arguments: { prompt: "!tokens 400 rate=20" } }, undefined, {
      signal: stop.signal,
      onprogress: () => undefined,
    });
    const startedMs = Date.now();
    await new Promise((res) => setTimeout(res, 1500));
    stop.abort();
    await assert.rejects(slow);
    // The run was aborted: the session's last run ended ABORTED, long before its 20 s of tokens.
    const sessions = await stack.gateway.listSessions({ pageSize: 100 });
    await waitFor("the cancelled run's end", async () => {
      for (const s of sessions.sessions) {
        const h = await stack.gateway.getHistory({ sessionId: s.sessionId, pageSize: 100 });
        if (h.messages.some((m) => m.text === "!tokens 400 rate=20")) {
          const info = (await stack.gateway.listSessions({ pageSize: 100 })).sessions.find(
            (x) => x.sessionId === s.sessionId,
          );
          return info?.running === false;
        }
      }
      return false;
    });
    assert.ok(Date.now() - startedMs < 15_000, "the run stopped when the request was cancelled");
    await client.close();
  });

  test("the MCP Inspector's CLI lists the agents and asks one", async () => {
    const cli = require.resolve("@modelcontextprotocol/inspector-cli/build/index.js");
    const inspect = async (...args: string[]) => {
      const { stdout } = await promisify(execFile)(
        process.execPath,
        [cli, `http://${stack.addr.http}/mcp`, "--header", `Authorization: Bearer ${stack.apiKey}`, ...args],
        // Its build looks for its package.json relative to the working directory and imports it
        // relative to itself: run from its own folder, the two agree.
        { timeout: 60_000, cwd: path.dirname(cli) },
      );
      return JSON.parse(stdout) as Record<string, unknown>;
    };
    const listed = (await inspect("--method", "tools/list")) as { tools: { name: string }[] };
    assert.ok(listed.tools.some((t) => t.name === "main"));
    const called = (await inspect(
      "--method",
      "tools/call",
      "--tool-name",
      "main",
      "--tool-arg",
      "prompt=from the inspector",
    )) as {
      content: { text: string }[];
    };
    assert.equal(called.content[0].text, "You said: from the inspector");
  });

  test("keys: none is 401 with the scheme; another tenant's session is not found", async () => {
    const bare = await fetch(`http://${stack.addr.http}/mcp`, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
    });
    assert.equal(bare.status, 401);
    assert.match(bare.headers.get("www-authenticate") ?? "", /^Bearer/);
    const owner = await mcpClient(stack.apiKey);
    const mine = await owner.callTool({ name: "main", arguments: { prompt: "private words" } });
    const session = (mine.structuredContent as { session: string }).session;
    const stranger = await mcpClient(await stack.keyFor("acme", "eve"));
    await assert.rejects(stranger.readResource({ uri: `troupe://sessions/${session}` }), /no resource/);
    assert.ok(!(await stranger.listResources()).resources.some((r) => r.name === session));
    // The same id names the stranger's own session, never the owner's.
    const theirs = await stranger.callTool({ name: "main", arguments: { prompt: "let me in", session } });
    assert.equal(theirs.isError, false, textOf(theirs));
    const read = await stranger.readResource({ uri: `troupe://sessions/${session}` });
    assert.doesNotMatch((read.contents[0] as { text: string }).text, /private words/);
    // Nor does the stranger's key reach the owner's MCP session.
    const hijack = await fetch(`http://${stack.addr.http}/mcp`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        authorization: `Bearer ${await stack.keyFor("acme", "eve")}`,
        "mcp-session-id": (owner as unknown as { transport: { sessionId: string } }).transport.sessionId,
        "mcp-protocol-version": "2025-06-18",
      },
      body: JSON.stringify({ jsonrpc: "2.0", id: 9, method: "resources/list" }),
    });
    assert.equal(hijack.status, 404);
    await owner.close();
    await stranger.close();
  });
});

/** The conformance suite's command line, its exit status and what it printed. */
async function conformance(args: string[]): Promise<{ ok: boolean; out: string }> {
  const bin = require.resolve("@modelcontextprotocol/conformance/dist/index.js");
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [bin, ...args], { timeout: 120_000 });
    return { ok: true, out: stdout + stderr };
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string };
    return { ok: false, out: `${e.stdout ?? ""}${e.stderr ?? ""}` };
  }
}

describe("the MCP conformance suite (@modelcontextprotocol/conformance)", () => {
  test("/mcp passes the server scenarios that apply to it", async () => {
    // The suite has no way to send a key: a host in front of /mcp adds it, as a host holding a
    // Troupe key does; everything else (Host and Origin included) goes through as sent.
    const key = stack.apiKey;
    const [host, port] = stack.addr.http.split(":");
    const front = createServer((req, res) => {
      const upstream = request(
        {
          host,
          port: Number(port),
          method: req.method,
          path: req.url,
          headers: { ...req.headers, authorization: `Bearer ${key}` },
        },
        (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        },
      );
      upstream.on("error", () => res.destroy());
      req.pipe(upstream);
    });
    await new Promise<void>((r) => front.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(front.address() as AddressInfo).port}/mcp`;
    try {
      // The rest are about features /mcp does not offer (prompts, completion, sampling,
      // elicitation, subscriptions) or name tools of the suite's own reference server.
      for (const scenario of [
        "server-initialize",
        "ping",
        "tools-list",
        "resources-list",
        "dns-rebinding-protection",
      ]) {
        const run = await conformance(["server", "--url", url, "--scenario", scenario]);
        assert.ok(run.ok, `${scenario}:\n${run.out}`);
      }
    } finally {
      front.closeAllConnections();
      front.close();
    }
  });

  test("the runner's MCP client passes the client scenarios", async () => {
    const client = `${process.execPath} ${path.resolve("dist/test/helpers/mcp-conformance-client.js")}`;
    for (const scenario of ["initialize", "tools_call"]) {
      const run = await conformance(["client", "--command", client, "--scenario", scenario]);
      assert.ok(run.ok, `${scenario}:\n${run.out}`);
    }
  });
});
