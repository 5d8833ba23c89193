// Every session's MCP connections in this runner. A session's servers are connected when its
// first run starts (their tools offered from that run on) and kept while it is used: a connection
// unused for IDLE_MS is closed, and made again by the next run. Connections are the session's own,
// held under its whole ref (tenant, principal, id: session ids are chosen by clients and repeat
// across owners), so one tenant's servers, credentials and results never reach another's session;
// a server whose spec changes in agent.json is connected anew.
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { SandboxService } from "../../../shared/gen/troupe/v1/sandbox_pb.js";
import type { Identity } from "../../../shared/auth/auth.js";
import { guardedFetch } from "../../../shared/net/guarded-fetch.js";
import type { NetPolicy } from "../../../shared/net/net-guard.js";
import type { ServiceClient } from "../../../shared/rpc.js";
import { refKey, type SessionRef } from "../../../shared/session-ref.js";
import type { EgressOf, Tool } from "../tools.js";
import type { Secrets } from "../web-tools.js";
import { fillSecrets, type McpServers, type McpServerSpec, secretsNamed } from "./mcp-config.js";
import type { McpConnection } from "./mcp-connection.js";

const IDLE_MS = 10 * 60_000;
/** Bytes one answer of a Streamable HTTP server may carry. */
const MAX_ANSWER_BYTES = 10 * 1024 * 1024;

/**
 * The MCP SDK and what this runner builds on it, loaded at the first connection: a runner whose
 * agents name no server does not hold it (6.5 MB of its resident memory, bench/footprint).
 */
const importSdk = () =>
  Promise.all([
    import("./mcp-connection.js"),
    import("./sandbox-stdio.js"),
    import("@modelcontextprotocol/sdk/client/streamableHttp.js"),
  ]);
let sdk: ReturnType<typeof importSdk> | undefined;
const loadSdk = () => (sdk ??= importSdk());

export interface McpSession {
  sessionId: string;
  agentId: string;
  owner: Identity;
  /** The agent's egress grant, which a stdio server's process gets as every command does. */
  egress: EgressOf;
}

/** One server of a session, as `troupe mcp ls` shows it (the McpServerStatus message). */
export interface McpServerStatus {
  name: string;
  transport: "http" | "stdio";
  state: string;
  error: string;
  tools: { name: string; description: string; refused: string }[];
}

interface Held {
  spec: string;
  connection: McpConnection;
}

export class McpHub {
  private readonly sessions = new Map<string, Map<string, Held>>();
  private readonly sweep: NodeJS.Timeout;

  constructor(
    private readonly deps: {
      net: NetPolicy;
      secrets: Secrets;
      sandbox: ServiceClient<(typeof SandboxService)["method"]>;
    },
  ) {
    this.sweep = setInterval(() => void this.closeIdle(Date.now()), 60_000);
    this.sweep.unref();
  }

  /**
   * The tools of the session's servers, connecting those not connected (all at once). A server
   * that cannot be reached adds no tools and a warning that says why; the run goes on.
   */
  async toolsFor(session: McpSession, servers: McpServers): Promise<{ tools: Tool[]; warnings: string[] }> {
    const held = await this.held(session, servers);
    const warnings: string[] = [];
    const tools: Tool[] = [];
    await Promise.all(
      [...held.values()].map(async ({ connection }) => {
        try {
          await connection.ready();
        } catch (err) {
          warnings.push(`MCP server ${connection.server} offers no tools in this run: ${(err as Error).message}`);
        }
      }),
    );
    for (const { connection } of held.values()) tools.push(...asTools(connection));
    return { tools, warnings };
  }

  /** The session's servers and their state, connecting each once to list its tools. */
  async status(session: McpSession, servers: McpServers): Promise<McpServerStatus[]> {
    const held = await this.held(session, servers);
    await Promise.all([...held.values()].map(({ connection }) => connection.ready().catch(() => undefined)));
    return [...held.entries()].map(([server, { connection }]) => ({
      name: server,
      transport: servers[server].url !== undefined ? "http" : "stdio",
      state: connection.state,
      error: connection.error,
      tools: connection.tools.map((t) => ({ name: t.name, description: t.description, refused: t.refused ?? "" })),
    }));
  }

  /** Closes a session's connections (the session was deleted or left this runner). */
  async closeSession(ref: SessionRef): Promise<void> {
    await this.close(refKey(ref));
  }

  private async close(key: string): Promise<void> {
    const held = this.sessions.get(key);
    this.sessions.delete(key);
    await Promise.all([...(held?.values() ?? [])].map((h) => h.connection.close()));
  }

  async closeIdle(now: number): Promise<void> {
    for (const [key, held] of this.sessions) {
      for (const [server, h] of held)
        if (now - h.connection.lastUsedMs > IDLE_MS) {
          held.delete(server);
          await h.connection.close();
        }
      if (held.size === 0) this.sessions.delete(key);
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.sweep);
    await Promise.all([...this.sessions.keys()].map((key) => this.close(key)));
  }

  /** The session's connections for `servers`: new ones made, changed ones replaced, dropped ones closed. */
  private async held(session: McpSession, servers: McpServers): Promise<Map<string, Held>> {
    const key = refKey({
      tenant: session.owner.tenant,
      principal: session.owner.principal,
      sessionId: session.sessionId,
    });
    const mine = this.sessions.get(key) ?? new Map<string, Held>();
    this.sessions.set(key, mine);
    if (Object.keys(servers).length === 0 && mine.size === 0) return mine;
    const [{ McpConnection }] = await loadSdk();
    const secrets = await this.deps.secrets.all();
    for (const [server, h] of mine)
      if (JSON.stringify(servers[server]) !== h.spec) {
        mine.delete(server);
        await h.connection.close();
      }
    for (const [server, spec] of Object.entries(servers)) {
      if (mine.has(server)) continue;
      const named = secretsNamed(spec, secrets);
      const scrub = (text: string) =>
        named.reduce((t, [n, v]) => (v.length >= 4 ? t.split(v).join(`[secret ${n}]`) : t), text);
      const connection = new McpConnection(server, async () => this.transport(session, server, spec, secrets), {
        callTimeoutMs: spec.timeoutSeconds !== undefined ? spec.timeoutSeconds * 1000 : undefined,
        scrub,
      });
      mine.set(server, { spec: JSON.stringify(spec), connection });
    }
    return mine;
  }

  private async transport(
    session: McpSession,
    server: string,
    spec: McpServerSpec,
    secrets: Record<string, string>,
  ): Promise<Transport> {
    const [, { SandboxStdioTransport, shellLine }, { StreamableHTTPClientTransport }] = await loadSdk();
    if (spec.url !== undefined) {
      const origin = new URL(spec.url).origin;
      const headers = Object.fromEntries(
        Object.entries(spec.headers ?? {}).map(([k, v]) => [k.toLowerCase(), fillSecrets(v, secrets, server)]),
      );
      const fetch = guardedFetch(this.deps.net, {
        // Credentials go to the configured origin only, never to where a redirect leads.
        headers: (url) => (url.origin === origin ? headers : {}),
        maxBytes: MAX_ANSWER_BYTES,
        headersTimeoutMs: 30_000,
      });
      return new StreamableHTTPClientTransport(new URL(spec.url), {
        fetch,
        reconnectionOptions: {
          initialReconnectionDelay: 1000,
          maxReconnectionDelay: 30_000,
          reconnectionDelayGrowFactor: 2,
          maxRetries: 2,
        },
      });
    }
    const env = Object.fromEntries(
      Object.entries(spec.env ?? {}).map(([k, v]) => [k, fillSecrets(v, secrets, server)]),
    );
    return new SandboxStdioTransport({
      sandbox: this.deps.sandbox,
      owner: session.owner,
      sessionId: session.sessionId,
      agentId: session.agentId,
      commandLine: shellLine(spec.command ?? "", spec.args ?? [], env),
      egress: await session.egress(),
    });
  }
}

/** A connection's usable tools as the loop's: read-only ones may run beside others of a batch. */
function asTools(connection: McpConnection): Tool[] {
  return connection.tools
    .filter((t) => t.refused === undefined)
    .map((t) => ({
      name: t.name,
      description: t.description,
      parameters: t.parameters,
      parallel: t.readOnly,
      mcp: connection.server,
      execute: (args, ctx) => connection.call(t.remote, args, ctx),
    }));
}
