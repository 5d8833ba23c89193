// The gateway client every client command uses: the API key (TROUPE_API_KEY, else the data
// directory's development key) and, for a gateway serving TLS, --tls or --ca.
import { readFile } from "node:fs/promises";
import { clientApiKey } from "../shared/auth/auth.js";
import type { Config } from "../shared/config/config-types.js";
import { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { SessionInfo } from "../shared/gen/troupe/v1/session_pb.js";
import { createClient, type ServiceClient } from "../shared/rpc.js";

export type GatewayClient = ServiceClient<(typeof GatewayService)["method"]>;

const LOOPBACK = /^(localhost|127\.|\[::1\]|unix:)/;

/** The client-side flags of every client command (loadConfig's `extra`). */
export const CLIENT_FLAGS = { tls: { type: "boolean" } } as const;

/**
 * A client of the configured gateway. `throughProxy` (the client commands'): the environment's
 * proxy applies, as to any gRPC client, except to a gateway on this machine. A channel adapter
 * runs beside the gateway, as part of the deployment, and passes false: it reaches the gateway
 * directly whatever proxy its chat API needs.
 */
export async function gatewayClient(
  cfg: Config & { flags: Record<string, unknown> },
  { throughProxy = true } = {},
): Promise<GatewayClient> {
  const tls = cfg.flags.tls === true || cfg.tlsCa !== "";
  return createClient(GatewayService, cfg.addr.gateway, {
    headers: { authorization: `Bearer ${await clientApiKey(cfg.dataDir, cfg.clientApiKey)}` },
    tls: tls ? { ca: cfg.tlsCa ? await readFile(cfg.tlsCa) : undefined } : undefined,
    // No proxy can reach a gateway on this machine for it.
    throughProxy: throughProxy && !LOOPBACK.test(cfg.addr.gateway),
  });
}

/** Every session the caller owns, page by page. */
export async function listAllSessions(gw: GatewayClient): Promise<SessionInfo[]> {
  const sessions: SessionInfo[] = [];
  let pageToken = "";
  do {
    const page = await gw.listSessions({ pageSize: 500, pageToken });
    sessions.push(...page.sessions);
    pageToken = page.nextPageToken;
  } while (pageToken);
  return sessions;
}
