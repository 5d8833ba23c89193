// Outbound calls through an HTTP proxy, where the network allows no other way out: model
// providers (the runner's pools, the memory service's embedding and learning models) and chat
// APIs (Telegram, Slack, a webhook's reply URL), as HTTPS_PROXY, HTTP_PROXY and NO_PROXY say
// (config.ts reads them; undici's EnvHttpProxyAgent routes each call). The agent tools' web
// requests, the gateway's media fetches and sandboxed commands' egress take it too, by proxyFor
// below: their guard (net-guard.ts) resolves and checks the address itself and tunnels to that
// address. gRPC between Troupe's services never takes it (rpc/client.ts turns grpc-js's own
// proxy support off).
import { createRequire } from "node:module";
import type { Agent, Dispatcher } from "undici";
import { undiciAgent } from "./undici-agent.js";

export interface OutboundProxy {
  /** For https:// endpoints. */
  httpsProxy?: string;
  /** For http:// endpoints, and https:// ones when httpsProxy is unset (undici's rule). */
  httpProxy?: string;
  /** Hosts reached directly, as NO_PROXY lists them. */
  noProxy?: string;
}

/** Reached directly whatever NO_PROXY says: no proxy can reach this machine's loopback for it. */
const LOOPBACK = ["localhost", "127.0.0.1", "::1"];

/** Whether calls to `url` go directly whatever proxy is configured (its host is in LOOPBACK). */
export const alwaysDirect = (url: string): boolean =>
  LOOPBACK.includes(new URL(url).hostname.replace(/^\[(.*)\]$/, "$1"));

const require = createRequire(import.meta.url);
let configured: OutboundProxy | undefined;

/**
 * Sets this process's proxy for outbound calls (undefined: direct), for Node's own fetch too.
 * Call once at start, before the first outbound call; the pools made before it stay direct.
 */
export function useOutboundProxy(proxy: OutboundProxy | undefined): void {
  configured = proxy?.httpsProxy || proxy?.httpProxy ? proxy : undefined;
  if (!configured) return;
  // undici's own file, loaded only with a proxy (undici-agent.ts says why not its index). Node's
  // fetch takes the dispatcher undici's setGlobalDispatcher sets.
  const { setGlobalDispatcher } = require("undici/lib/global.js") as { setGlobalDispatcher(d: Dispatcher): void };
  setGlobalDispatcher(outboundAgent({}));
}

/** A pool for outbound calls with `options`: through the configured proxy, else a plain Agent. */
export function outboundAgent(options: Agent.Options): Agent {
  // Also gives every dispatcher undici's request API (undici-agent.ts), the proxy's among them.
  const Pool = undiciAgent();
  if (!configured) return new Pool(options);
  const EnvHttpProxyAgent = require("undici/lib/dispatcher/env-http-proxy-agent.js") as typeof Agent;
  // Empty strings, not undefined: undici would read the environment for what is missing, and the
  // configuration (config.ts) is the one reader of the environment.
  return new EnvHttpProxyAgent({
    ...options,
    httpsProxy: configured.httpsProxy ?? "",
    httpProxy: configured.httpProxy ?? "",
    noProxy: [configured.noProxy ?? "", ...LOOPBACK].filter(Boolean).join(","),
  } as Agent.Options);
}

/**
 * The proxy a request to `url` goes through, or undefined: directly. The same rules as undici's
 * EnvHttpProxyAgent (outboundAgent), so every outbound call of a process agrees: https:// takes
 * httpsProxy, else httpProxy; http:// takes httpProxy; loopback and NO_PROXY's hosts go directly.
 */
export function proxyFor(proxy: OutboundProxy | undefined, url: URL): string | undefined {
  const via = url.protocol === "https:" ? proxy?.httpsProxy || proxy?.httpProxy : proxy?.httpProxy;
  if (!via) return undefined;
  const host = url.hostname
    .replace(/^\[(.*)\]$/, "$1")
    .toLowerCase()
    .replace(/\.$/, "");
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  if (LOOPBACK.includes(host) || bypassed(proxy?.noProxy ?? "", host, port)) return undefined;
  return via;
}

/**
 * Whether NO_PROXY names `host` (lower case, no brackets) on `port`, as undici reads it: entries
 * split on commas and spaces, each a host with an optional port; `*` is every host; `name` and
 * `.name` are the name and everything under it, `*.name` only what is under it.
 */
function bypassed(noProxy: string, host: string, port: number): boolean {
  for (const entry of noProxy.split(/[,\s]/)) {
    if (entry === "") continue;
    const m = /^\[(.+)\]:(\d+)$/.exec(entry) ?? /^([^:]+):(\d+)$/.exec(entry);
    const name = (m ? m[1] : entry.replace(/^\[(.+)\]$/, "$1")).toLowerCase();
    if (m && Number(m[2]) !== port) continue;
    if (name === "*") return true;
    const base = name.replace(/^\*?\./, "").replace(/\.$/, "");
    if ((!name.startsWith("*") && host === base) || host.endsWith(`.${base}`)) return true;
  }
  return false;
}

/** The proxies' host:port, for what a person reads (a proxy URL may carry credentials). */
export function proxyHosts(proxy: OutboundProxy): string {
  const hosts = [proxy.httpsProxy, proxy.httpProxy].flatMap((u) => (u ? [new URL(u).host] : []));
  return [...new Set(hosts)].join(" and ");
}
