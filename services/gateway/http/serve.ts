// The gateway's HTTP address, put together: the Connect routes (gateway/http/edge.ts) in front of the
// gateway's own gRPC server, and beside them the OpenAI-compatible endpoint (openai-compat.ts),
// the MCP server (mcp-server.ts) and A2A's cards and JSON-RPC binding (a2a/jsonrpc.ts).
import { existsSync, readFileSync } from "node:fs";
import type { Authenticator } from "../../shared/auth/auth.js";
import type { Config } from "../../shared/config/config-types.js";
import type { Logger } from "../../shared/process/log.js";
import type { RpcServer } from "../../shared/rpc.js";
import type { A2aCore } from "../a2a/a2a-core.js";
import { a2aJsonRpc } from "../a2a/jsonrpc.js";
import type { Loopback } from "../loopback.js";
import { answer, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import { type HttpEdge, startHttpEdge } from "./edge.js";
import { openAiCompat } from "./openai-compat.js";
import { DEFAULT_NET_POLICY } from "../../shared/net/net-guard.js";
import { mcpServer } from "./mcp-server.js";

/** An HTTP address only this machine reaches. */
const LOOPBACK_ADDR = /^(localhost|127(\.\d{1,3}){3}|\[::1\]):\d+$/;

/**
 * The gateway's HTTP face for a gateway whose gRPC server is `server`: serves HTTP on
 * cfg.httpAddr, passing calls through to that server over its loopback socket (loopback.ts).
 */
export async function serveHttp(
  cfg: Config,
  server: RpcServer,
  loopback: Loopback,
  a2a: { core: A2aCore; grpcPort: number },
  authenticate: Authenticator,
  logger: Logger,
): Promise<HttpEdge> {
  const { gateway, admin } = loopback;
  const openAi = openAiCompat(gateway, {
    maxBodyBytes: cfg.maxMessageBytes,
    agentsDir: cfg.agentsDir,
    // What an image_url may be fetched from: the SSRF guard's policy, as for channel media.
    net: { ...DEFAULT_NET_POLICY, ...cfg.net, proxy: cfg.outboundProxy },
  });
  const mcp = mcpServer(gateway, {
    maxBodyBytes: cfg.maxMessageBytes,
    agentsDir: cfg.agentsDir,
    loopback: LOOPBACK_ADDR.test(cfg.httpAddr),
    cors: cfg.httpCors,
  });
  const agents = a2aJsonRpc(a2a.core, {
    maxBodyBytes: cfg.maxMessageBytes,
    agentsDir: cfg.agentsDir,
    card: { grpcPort: a2a.grpcPort, tls: cfg.tls !== undefined },
  });
  const webConsole = consoleFiles(logger);
  const edge = await startHttpEdge({
    address: cfg.httpAddr,
    gateway,
    admin,
    maxMessageBytes: cfg.maxMessageBytes,
    cors: cfg.httpCors,
    tls: cfg.tls,
    authenticate,
    isPublic: (req) => webConsole.has(req) || agents.isPublic(req),
    ready: () => server.serving,
    connections: cfg.httpConnections,
    fallback: async (req, res) =>
      (await openAi(req, res)) || (await mcp(req, res)) || (await agents.serve(req, res)) || webConsole.serve(req, res),
    logger,
  });
  logger.info(`gateway HTTP on port ${edge.port}${cfg.tls ? " (TLS)" : ""}`, { cors: cfg.httpCors.join(",") });
  return {
    port: edge.port,
    async close(graceMs) {
      await edge.close(graceMs);
    },
  };
}

const CONSOLE_FILES: Record<string, [string, string]> = {
  "/": ["index.html", "text/html; charset=utf-8"],
  "/app.js": ["app.js", "text/javascript; charset=utf-8"],
  "/console.css": ["console.css", "text/css; charset=utf-8"],
};

/**
 * The web console's files (console/, copied beside this module at build), served at /. The page
 * may load and call nothing but this origin, and may not be framed.
 */
function consoleFiles(logger: Logger): {
  has(req: NodeServerRequest): boolean;
  serve(req: NodeServerRequest, res: NodeServerResponse): boolean;
} {
  const dir = new URL("../console/", import.meta.url);
  const files = new Map<string, [Buffer, string]>();
  for (const [route, [name, type]] of Object.entries(CONSOLE_FILES)) {
    const file = new URL(name, dir);
    if (existsSync(file)) files.set(route, [readFileSync(file), type]);
  }
  if (files.size < Object.keys(CONSOLE_FILES).length)
    logger.warn("the web console's files are missing from the build (make build copies them); / answers 404");
  const fileOf = (req: NodeServerRequest) =>
    req.method === "GET" && URL.canParse(req.url ?? "/", "http://x")
      ? files.get(new URL(req.url ?? "/", "http://x").pathname)
      : undefined;
  return { has: (req) => fileOf(req) !== undefined, serve };
  function serve(req: NodeServerRequest, res: NodeServerResponse): boolean {
    const found = fileOf(req);
    if (!found) return false;
    answer(
      res,
      200,
      {
        "content-type": found[1],
        "cache-control": "no-cache",
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "content-security-policy":
          "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
      },
      found[0],
    );
    return true;
  }
}
