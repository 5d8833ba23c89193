// The gateway's HTTP address, put together: the Connect routes (http-edge.ts) in front of the
// gateway's own gRPC server, and the OpenAI-compatible endpoint (openai-compat.ts) beside them.
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { Config } from "../shared/config.js";
import { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { Logger } from "../shared/log.js";
import { createClient, type RpcServer } from "../shared/rpc.js";
import { type HttpEdge, startHttpEdge } from "./http-edge.js";
import { openAiCompat } from "./openai-compat.js";

/**
 * The gateway's HTTP face for a gateway whose gRPC server is `server`: binds that server on a
 * private Unix socket (a directory only this user can enter; calls through it still need an API
 * key) and serves HTTP on cfg.httpAddr, passing calls through.
 */
export async function serveHttp(cfg: Config, server: RpcServer, logger: Logger): Promise<HttpEdge> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "troupe-gateway-"));
  const socket = path.join(dir, "grpc.sock");
  await server.listen(`unix:${socket}`);
  const gateway = createClient(GatewayService, `unix:${socket}`, { maxMessageBytes: cfg.maxMessageBytes });
  const edge = await startHttpEdge({
    address: cfg.httpAddr,
    gateway,
    maxMessageBytes: cfg.maxMessageBytes,
    cors: cfg.httpCors,
    tls: cfg.tls,
    fallback: openAiCompat(gateway, { maxBodyBytes: cfg.maxMessageBytes, agentsDir: cfg.agentsDir }),
    logger,
  });
  logger.info(`gateway HTTP on port ${edge.port}${cfg.tls ? " (TLS)" : ""}`, { cors: cfg.httpCors.join(",") });
  return {
    port: edge.port,
    async close(graceMs) {
      await edge.close(graceMs);
      gateway.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
