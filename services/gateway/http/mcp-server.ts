// Troupe's agents as an MCP server, at /mcp on the HTTP edge (Streamable HTTP, the SDK's server
// transport, with sessions: a host's cancellation arrives in a request of its own and must find
// the call it cancels; see McpSessions below). What a host sees:
//   - tools: one per agent (the agents directory's, as /v1/models lists them, and the default),
//     taking a `prompt` and an optional `session` to continue; the answer is the run's reply, with
//     the session's id in structured content so the next call can continue it;
//   - progress notifications while the run goes (its tool calls and messages), when the host
//     gave a progress token; a cancelled request aborts the run;
//   - resources: the caller's sessions (troupe://sessions/<id>), read as their transcript.
// Every step is a gateway gRPC call with the caller's key (the Bearer header, checked by the
// edge's admission before the body is read), so keys, limits, quotas and ownership are the gRPC
// API's: a session that is not the caller's is not found.
import { createHash, randomUUID } from "node:crypto";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import {
  CallToolRequestSchema,
  type CallToolResult,
  ErrorCode,
  ListResourcesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { QueueMode, Role, StopReason } from "../../shared/gen/troupe/v1/session_pb.js";
import { Status, toStatus } from "../../shared/errors.js";
import { listAgents } from "./agent-list.js";
import { answer, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import type { GatewayClient } from "./edge.js";
import { forwardedMetadata } from "./metadata.js";
import { readJson } from "./openai-request.js";
import { runEvents } from "./run-events.js";

export const MCP_PATH = "/mcp";
const SESSION_URI = "troupe://sessions/";
/** A run this long without its end is given up on (the run itself goes on). */
const RUN_TIMEOUT_MS = 15 * 60_000;
const HISTORY_PAGE = 200;

const INPUT_SCHEMA = {
  type: "object" as const,
  properties: {
    prompt: { type: "string", minLength: 1, description: "What to ask the agent." },
    session: {
      type: "string",
      description: "A session to continue (the `session` a previous call returned); absent: a new session.",
    },
  },
  required: ["prompt"],
  additionalProperties: false,
};

const OUTPUT_SCHEMA = {
  type: "object" as const,
  properties: { reply: { type: "string" }, session: { type: "string" } },
  required: ["reply", "session"],
};

/** A gateway failure as the tool's error result: the status's name and what it said. */
function failed(err: unknown): CallToolResult {
  const { code, details } = toStatus(err);
  return { content: [{ type: "text", text: `${Status[code] ?? "INTERNAL"}: ${details}` }], isError: true };
}

const LOOPBACK = new Set(["localhost", "127.0.0.1", "[::1]"]);

/**
 * Why a request may not reach /mcp from where it says it comes from, or undefined. A browser
 * page may send a request here (DNS rebinding makes a page's own name point at this address): its
 * Origin must be one the operator allows (TROUPE_HTTP_CORS), and on a loopback address the Host
 * must be a loopback name, as the MCP specification asks of local servers.
 */
export function originProblem(
  headers: NodeServerRequest["headers"],
  edge: { loopback: boolean; cors: readonly string[] },
): string | undefined {
  const host = String(headers.host ?? headers[":authority"] ?? "");
  const hostname = URL.canParse(`http://${host}`) ? new URL(`http://${host}`).hostname : "";
  if (edge.loopback && !LOOPBACK.has(hostname)) return `Host ${host.slice(0, 100)} is not this local server`;
  const origin = headers.origin;
  if (typeof origin !== "string") return undefined;
  if (edge.cors.includes("*") || edge.cors.includes(origin)) return undefined;
  const from = URL.canParse(origin) ? new URL(origin).hostname : "";
  if (edge.loopback && LOOPBACK.has(from)) return undefined;
  return `Origin ${origin.slice(0, 100)} may not call this server (TROUPE_HTTP_CORS)`;
}

export function mcpServer(
  gateway: GatewayClient,
  opts: { maxBodyBytes: number; agentsDir: string; loopback: boolean; cors: readonly string[] },
) {
  /** The MCP server of one request, speaking for its caller. */
  const serverFor = (req: NodeServerRequest): Server => {
    const metadata = forwardedMetadata(req.headers);
    const server = new Server(
      { name: "troupe", version: "0.1.0" },
      {
        capabilities: { tools: {}, resources: {} },
        instructions: "Each tool is a Troupe agent: give it a prompt, and a session to continue one.",
      },
    );

    server.setRequestHandler(ListToolsRequestSchema, async () => ({
      tools: (await listAgents(opts.agentsDir)).map((agent) => ({
        name: agent,
        title: `Troupe agent ${agent}`,
        description: `Ask the Troupe agent ${agent}; its reply comes back, with the session to continue.`,
        inputSchema: INPUT_SCHEMA,
        outputSchema: OUTPUT_SCHEMA,
      })),
    }));

    server.setRequestHandler(CallToolRequestSchema, async (request, extra): Promise<CallToolResult> => {
      const agentId = request.params.name;
      if (!(await listAgents(opts.agentsDir)).includes(agentId))
        throw new McpError(ErrorCode.InvalidParams, `no agent ${agentId.slice(0, 100)}`);
      const args = request.params.arguments ?? {};
      if (typeof args.prompt !== "string" || args.prompt.trim() === "")
        throw new McpError(ErrorCode.InvalidParams, "`prompt` must be a non-empty string");
      if (args.session !== undefined && typeof args.session !== "string")
        throw new McpError(ErrorCode.InvalidParams, "`session` must be a string");
      const token = request.params._meta?.progressToken;
      let progress = 0;
      const say = async (message: string) => {
        if (token === undefined) return;
        await extra
          .sendNotification({
            method: "notifications/progress",
            params: { progressToken: token, progress: ++progress, message },
          })
          .catch(() => undefined);
      };
      let sessionId: string;
      const frameId = randomUUID();
      let afterSeq: bigint;
      try {
        const opened = await gateway.createSession({ sessionId: args.session ?? "", agentId }, { metadata });
        sessionId = opened.session!.sessionId;
        const sent = await gateway.sendMessage(
          { sessionId, frameId, text: args.prompt, queueMode: QueueMode.FOLLOWUP },
          { metadata },
        );
        afterSeq = sent.accepted!.seq;
      } catch (err) {
        return failed(err);
      }
      // The host's cancellation (notifications/cancelled) aborts the run, as a client's abort would.
      const stop = new AbortController();
      const onCancel = () => {
        void gateway
          .abort({ sessionId, frameId: randomUUID(), reason: "the MCP request was cancelled" }, { metadata })
          .catch(() => undefined);
        stop.abort();
      };
      extra.signal.addEventListener("abort", onCancel, { once: true });
      const timer = setTimeout(() => stop.abort(), RUN_TIMEOUT_MS);
      const replies: string[] = [];
      try {
        for await (const event of runEvents(gateway, { sessionId, afterSeq, frameId, metadata, signal: stop.signal })) {
          const p = event.payload;
          if (p.case === "toolExecutionStart") await say(`${p.value.toolName} running`);
          else if (p.case === "toolExecutionEnd")
            await say(`${p.value.toolName} ${p.value.isError ? "failed" : "done"}`);
          else if (p.case === "messageEnd" && p.value.message?.role === Role.ASSISTANT && p.value.message.text !== "") {
            replies.push(p.value.message.text);
            await say("the agent replied");
          } else if (p.case === "runWaiting")
            await say("the run waits on a decision (see the session's pending calls)");
          else if (p.case === "agentEnd") {
            const reply = replies.join("\n\n");
            const isError = p.value.stopReason === StopReason.ERROR || p.value.stopReason === StopReason.ABORTED;
            const text = isError
              ? `${reply}${reply ? "\n\n" : ""}[the run ended: ${p.value.errorMessage || StopReason[p.value.stopReason]}]`
              : reply;
            return { content: [{ type: "text", text }], structuredContent: { reply, session: sessionId }, isError };
          }
        }
        return failed(new Error("the run's events ended before the run did"));
      } catch (err) {
        if (extra.signal.aborted) return { content: [{ type: "text", text: "cancelled" }], isError: true };
        if (stop.signal.aborted)
          return failed({ code: Status.DEADLINE_EXCEEDED, details: "the run did not end in time" });
        return failed(err);
      } finally {
        clearTimeout(timer);
        extra.signal.removeEventListener("abort", onCancel);
      }
    });

    server.setRequestHandler(ListResourcesRequestSchema, async (request) => {
      const page = await gateway
        .listSessions({ pageSize: 100, pageToken: request.params?.cursor ?? "" }, { metadata })
        .catch((err) => {
          throw new McpError(ErrorCode.InternalError, toStatus(err).details);
        });
      return {
        resources: page.sessions.map((s) => ({
          uri: `${SESSION_URI}${encodeURIComponent(s.sessionId)}`,
          name: s.sessionId,
          title: `Session ${s.sessionId} with ${s.agentId}`,
          mimeType: "text/plain",
        })),
        ...(page.nextPageToken ? { nextCursor: page.nextPageToken } : {}),
      };
    });

    server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
      const uri = request.params.uri;
      let sessionId = "";
      try {
        sessionId = uri.startsWith(SESSION_URI) ? decodeURIComponent(uri.slice(SESSION_URI.length)) : "";
      } catch {}
      // A session that is not the caller's reads as one that does not exist.
      const missing = new McpError(ErrorCode.InvalidParams, `no resource ${uri.slice(0, 200)}`);
      if (sessionId === "") throw missing;
      const history = await gateway.getHistory({ sessionId, pageSize: HISTORY_PAGE }, { metadata }).catch(() => {
        throw missing;
      });
      const lines = history.messages.map((m) => `${Role[m.role].toLowerCase()}: ${m.text}`);
      return { contents: [{ uri, mimeType: "text/plain", text: lines.join("\n\n") }] };
    });
    return server;
  };

  const sessions = new McpSessions();

  return async (req: NodeServerRequest, res: NodeServerResponse): Promise<boolean> => {
    const url = new URL(req.url ?? "/", "http://troupe");
    if (url.pathname !== MCP_PATH) return false;
    const refused = originProblem(req.headers, opts);
    if (refused) {
      req.resume();
      answer(res, 403, JSON_TYPE, JSON.stringify(rpcError(refused)));
      return true;
    }
    const caller = callerOf(req);
    const named = req.headers["mcp-session-id"];
    let body: unknown;
    if (req.method === "POST")
      try {
        body = await readJson(req, opts.maxBodyBytes);
      } catch (err) {
        answer(res, 400, JSON_TYPE, JSON.stringify(rpcError((err as Error).message, -32700)));
        return true;
      }
    if (typeof named === "string" && named !== "") {
      // Another caller's session and an unknown one look the same: 404, which tells a host to
      // start a new session (the specification's word for a session this server no longer has).
      const held = sessions.get(named, caller);
      if (!held) {
        answer(res, 404, JSON_TYPE, JSON.stringify(rpcError("no such MCP session", -32001)));
        return true;
      }
      await held.transport.handleRequest(req as never, res as never, body);
      return true;
    }
    if (req.method !== "POST") {
      answer(res, 400, JSON_TYPE, JSON.stringify(rpcError("no Mcp-Session-Id: initialize first, by POST")));
      return true;
    }
    const room = sessions.roomFor(caller);
    if (room) {
      answer(res, 429, JSON_TYPE, JSON.stringify(rpcError(room)));
      return true;
    }
    const server = serverFor(req);
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => sessions.add(id, caller, { server, transport }),
      onsessionclosed: (id) => sessions.remove(id),
    });
    await server.connect(transport);
    await transport.handleRequest(req as never, res as never, body);
    // A request that was not an initialize made no session: nothing is kept.
    if (transport.sessionId === undefined) await server.close().catch(() => undefined);
    return true;
  };
}

const JSON_TYPE = { "content-type": "application/json" };
const rpcError = (message: string, code = -32000) => ({ jsonrpc: "2.0", error: { code, message }, id: null });

/** Who calls: a digest of the credential the edge's admission accepted (sessions are bound to it). */
function callerOf(req: NodeServerRequest): string {
  const header = req.headers.authorization ?? req.headers["x-api-key"] ?? "";
  return createHash("sha256").update(String(header)).digest("hex");
}

/** Sessions unused this long are closed; a host that comes back is told 404 and starts anew. */
const IDLE_MS = 30 * 60_000;
const PER_CALLER = 32;
const IN_ALL = 10_000;

interface Held {
  server: Server;
  transport: StreamableHTTPServerTransport;
}

/**
 * The MCP sessions of this gateway, each bound to the credential that made it. They live in this
 * process: a host sent to another gateway is told 404 and initializes again there.
 */
class McpSessions {
  private readonly held = new Map<string, Held & { caller: string; usedMs: number }>();
  private readonly sweep: NodeJS.Timeout;

  constructor() {
    this.sweep = setInterval(() => this.closeIdle(Date.now()), 60_000);
    this.sweep.unref();
  }

  get(id: string, caller: string): Held | undefined {
    const h = this.held.get(id);
    if (!h || h.caller !== caller) return undefined;
    h.usedMs = Date.now();
    return h;
  }

  /** Why `caller` may not open another session now, or undefined. */
  roomFor(caller: string): string | undefined {
    if (this.held.size >= IN_ALL) return "this gateway holds as many MCP sessions as it may; try again later";
    let mine = 0;
    for (const h of this.held.values()) if (h.caller === caller) mine++;
    return mine >= PER_CALLER ? `a key may hold ${PER_CALLER} MCP sessions at once; end one (DELETE) first` : undefined;
  }

  add(id: string, caller: string, h: Held): void {
    this.held.set(id, { ...h, caller, usedMs: Date.now() });
  }

  remove(id: string): void {
    const h = this.held.get(id);
    this.held.delete(id);
    void h?.server.close().catch(() => undefined);
  }

  closeIdle(now: number): void {
    for (const [id, h] of this.held) if (now - h.usedMs > IDLE_MS) this.remove(id);
  }
}
