// The gateway's HTTP address, put together: the Connect routes (gateway/http/edge.ts) in front of the
// gateway's own gRPC server, and beside them the OpenAI-compatible endpoint (openai-compat.ts) and
// the MCP server (mcp-server.ts).
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { Authenticator } from "../../shared/auth/auth.js";
import type { Config } from "../../shared/config/config-types.js";
import { AdminService } from "../../shared/gen/troupe/v1/admin_pb.js";
import { GatewayService } from "../../shared/gen/troupe/v1/gateway_pb.js";
import type { Logger } from "../../shared/process/log.js";
import { createClient, type RpcServer } from "../../shared/rpc.js";
import { answer, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import { type HttpEdge, startHttpEdge } from "./edge.js";
import { openAiCompat } from "./openai-compat.js";
import { DEFAULT_NET_POLICY } from "../../shared/net/net-guard.js";
import { mcpServer } from "./mcp-server.js";

/** An HTTP address only this machine reaches. */
const LOOPBACK_ADDR = /^(localhost|127(\.\d{1,3}){3}|\[::1\]):\d+$/;

/**
 * The gateway's HTTP face for a gateway whose gRPC server is `server`: binds that server on a
 * private Unix socket (a directory only this user can enter; calls through it still need an API
 * key) and serves HTTP on cfg.httpAddr, passing calls through.
 */
export async function serveHttp(
  cfg: Config,
  server: RpcServer,
  authenticate: Authenticator,
  logger: Logger,
): Promise<HttpEdge> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "troupe-gateway-"));
  const socket = path.join(dir, "grpc.sock");
  await server.listen(`unix:${socket}`);
  const gateway = createClient(GatewayService, `unix:${socket}`, { maxMessageBytes: cfg.maxMessageBytes });
  const admin = createClient(AdminService, `unix:${socket}`, { maxMessageBytes: cfg.maxMessageBytes });
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
  const webConsole = consoleFiles(logger);
  const edge = await startHttpEdge({
    address: cfg.httpAddr,
    gateway,
    admin,
    maxMessageBytes: cfg.maxMessageBytes,
    cors: cfg.httpCors,
    tls: cfg.tls,
    authenticate,
    isPublic: webConsole.has,
    ready: () => server.serving,
    connections: cfg.httpConnections,
    fallback: async (req, res) => (await openAi(req, res)) || (await mcp(req, res)) || webConsole.serve(req, res),
    logger,
  });
  logger.info(`gateway HTTP on port ${edge.port}${cfg.tls ? " (TLS)" : ""}`, { cors: cfg.httpCors.join(",") });
  return {
    port: edge.port,
    async close(graceMs) {
      await edge.close(graceMs);
      gateway.close();
      admin.close();
      rmSync(dir, { recursive: true, force: true });
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
