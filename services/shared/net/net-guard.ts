// The SSRF guard. Every outbound HTTP request an agent causes (web_fetch, http_request) goes
// through guardedRequest, which:
//   - takes http and https only, no credentials in the URL, ports from the policy's list;
//   - reads the host as the WHATWG URL parser does (so 2130706433, 0x7f.1, 0177.0.0.1 and
//     [::ffff:127.0.0.1] are all 127.0.0.1 by the time they are checked);
//   - resolves a name once, refuses it if ANY of its addresses is not public, and connects to the
//     address it checked (the socket's lookup is pinned to it: no second resolution to rebind);
//   - follows redirects itself, each one checked the same way, up to the policy's cap;
//   - where an HTTP proxy is configured (the policy's `proxy`, outbound-proxy.ts proxyFor), asks
//     it for a CONNECT tunnel to the address it checked (never to the name, which the proxy would
//     resolve again), and speaks to the site inside it: TLS named for the site, Host the site's.
// A refusal is a NetRefusal whose message says why; nothing is sent to a refused address.
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { undiciAgent } from "./undici-agent.js";
import { readCapped } from "./bounded-body.js";
import { addressRefusal, BLOCKED_NAMES, blockList } from "./address-ranges.js";
import { type OutboundProxy, proxyFor, proxyHosts } from "./outbound-proxy.js";
import { createRequire } from "node:module";

export class NetRefusal extends Error {}

export interface NetPolicy {
  /** Ports a URL may name; the scheme's default port counts as named. */
  ports: readonly number[];
  /** Ranges (CIDR) treated as public although they are not: an operator's internal API, or tests. */
  allow: readonly string[];
  /** Redirects followed before giving up. */
  maxRedirects: number;
  /** A host name's addresses; dns.lookup by default. */
  resolve?: (host: string) => Promise<{ address: string; family: number }[]>;
  /** The HTTP proxy requests leave through (HTTPS_PROXY, HTTP_PROXY, NO_PROXY); none: directly. */
  proxy?: OutboundProxy;
}

export const DEFAULT_NET_POLICY: NetPolicy = { ports: [80, 443], allow: [], maxRedirects: 5 };

/** `host` is one of `patterns` (exact names, or *.example.com for names under example.com). */
export function hostMatches(host: string, patterns: readonly string[]): boolean {
  const h = host.toLowerCase().replace(/\.$/, "");
  return patterns.some((p) => (p.startsWith("*.") ? h.endsWith(p.slice(1)) && h.length > p.length - 1 : h === p));
}

/** A URL the policy lets us request, and the address its connection must go to. */
export interface CheckedTarget {
  url: URL;
  address: string;
  family: number;
}

/** Checks a URL and resolves its host (once); throws NetRefusal saying why it may not be fetched. */
export async function checkTarget(
  raw: string | URL,
  policy: NetPolicy,
  allow = blockList(policy.allow),
): Promise<CheckedTarget> {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new NetRefusal(`${JSON.stringify(String(raw).slice(0, 200))} is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new NetRefusal(`only http and https URLs are fetched, not ${url.protocol.replace(/:$/, "")}`);
  if (url.username !== "" || url.password !== "")
    throw new NetRefusal("a URL with credentials (user:password@) is not fetched");
  const port = url.port === "" ? (url.protocol === "https:" ? 443 : 80) : Number(url.port);
  if (!policy.ports.includes(port))
    throw new NetRefusal(`port ${port} is not allowed (allowed: ${policy.ports.join(", ")})`);
  const host = url.hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "") throw new NetRefusal("the URL has no host");
  if (isIP(host) !== 0) {
    const why = addressRefusal(host, allow);
    if (why) throw new NetRefusal(`${url.host}: ${why}`);
    return { url, address: host, family: isIP(host) };
  }
  const name = host.replace(/\.$/, "");
  if (BLOCKED_NAMES.test(name)) throw new NetRefusal(`${name} names this machine or a metadata service`);
  let addresses: { address: string; family: number }[];
  try {
    addresses = await (policy.resolve ?? ((h) => lookup(h, { all: true, verbatim: true })))(name);
  } catch (err) {
    throw new NetRefusal(`${name} does not resolve (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  if (addresses.length === 0) throw new NetRefusal(`${name} does not resolve`);
  for (const a of addresses) {
    const why = addressRefusal(a.address, allow);
    if (why) throw new NetRefusal(`${name} resolves to ${a.address}: ${why.replace(`${a.address} is `, "")}`);
  }
  return { url, address: addresses[0].address, family: addresses[0].family };
}

export interface GuardedRequest {
  method?: string;
  /** Headers for one hop; called again for each redirect, so a credential can be kept to its host. */
  headers?: (url: URL) => Record<string, string>;
  body?: string | Buffer;
  /** Checks each hop beyond the guard (an agent's allowed hosts); throws NetRefusal to stop. */
  checkHop?: (url: URL) => void;
  /** Body bytes kept; the rest is not read. */
  maxBytes: number;
  /** The whole request, redirects and body included. */
  timeoutMs: number;
  signal?: AbortSignal;
}

export interface GuardedResponse {
  url: URL;
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
  /** The body was longer than maxBytes. */
  truncated: boolean;
  /** The URLs redirected from, in order. */
  redirectedFrom: string[];
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/** A response whose headers came, its body not yet read: the last hop of guardedOpen. */
export interface GuardedOpen {
  url: URL;
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: AsyncIterable<Uint8Array> & { destroy(): void };
  redirectedFrom: string[];
}

/**
 * Sends a request through the guard (see the top of this file), following redirects, and returns
 * once the last hop's headers come. `signal` ends it, body included. The caller reads or destroys
 * the body.
 */
export async function guardedOpen(
  raw: string | URL,
  req: Omit<GuardedRequest, "maxBytes" | "timeoutMs">,
  policy: NetPolicy,
  signal: AbortSignal,
): Promise<GuardedOpen> {
  const allow = blockList(policy.allow);
  let method = (req.method ?? "GET").toUpperCase();
  let body = req.body;
  const redirectedFrom: string[] = [];
  let next: string | URL = raw;
  for (;;) {
    const target = await checkTarget(next, policy, allow);
    req.checkHop?.(target.url);
    const res = await send(target, method, req.headers?.(target.url) ?? {}, body, signal, policy.proxy);
    const location = res.headers.location;
    if (REDIRECTS.has(res.statusCode) && typeof location === "string") {
      await res.body.dump().catch(() => undefined);
      if (redirectedFrom.length >= policy.maxRedirects)
        throw new NetRefusal(`more than ${policy.maxRedirects} redirects`);
      redirectedFrom.push(target.url.href);
      next = new URL(location, target.url);
      // As browsers do: 303, and 301/302 after a POST, become a GET without a body.
      if (res.statusCode === 303 || ((res.statusCode === 301 || res.statusCode === 302) && method === "POST")) {
        method = method === "HEAD" ? "HEAD" : "GET";
        body = undefined;
      }
      continue;
    }
    return { url: target.url, status: res.statusCode, headers: res.headers, body: res.body, redirectedFrom };
  }
}

/** Sends a request through the guard (see the top of this file) and reads at most maxBytes of its body. */
export async function guardedRequest(raw: string, req: GuardedRequest, policy: NetPolicy): Promise<GuardedResponse> {
  const timeout = AbortSignal.timeout(req.timeoutMs);
  const signal = req.signal ? AbortSignal.any([req.signal, timeout]) : timeout;
  try {
    const res = await guardedOpen(raw, req, policy, signal);
    const { data, truncated } = await readCapped(res.body, req.maxBytes);
    return { ...res, body: data, truncated };
  } catch (err) {
    if (timeout.aborted && !req.signal?.aborted) throw new NetRefusal(`no complete answer within ${req.timeoutMs} ms`);
    throw err;
  }
}

async function send(
  target: CheckedTarget,
  method: string,
  headers: Record<string, string>,
  body: string | Buffer | undefined,
  signal: AbortSignal,
  proxy: OutboundProxy | undefined,
) {
  const via = proxyFor(proxy, target.url);
  const { origin, pathname, search } = via ? addressed(target) : target.url;
  const agent = via ? tunnelTo(via, target) : pinnedTo(target);
  try {
    const res = await agent.request({
      origin,
      path: pathname + search,
      method: method as "GET",
      headers: via ? { ...headers, host: target.url.host } : headers,
      body,
      signal,
    });
    res.body.once("close", () => void agent.close().catch(() => undefined));
    return res;
  } catch (err) {
    await agent.destroy().catch(() => undefined);
    // The proxy's refusal of the tunnel, said as such: undici words it "Proxy response (407) !== 200".
    const refused = via && !signal.aborted && /^Proxy response \((\d+)\)/.exec((err as Error).message ?? "");
    if (refused)
      throw new NetRefusal(
        `the proxy at ${proxyHosts({ httpsProxy: via })} refused a tunnel to ${target.url.host} (HTTP ${refused[1]}${refused[1] === "407" ? ": it wants credentials, given in the proxy's URL" : ""})`,
      );
    throw err;
  }
}

/**
 * One agent per hop, its lookup answering with the address checked above, whatever DNS says now.
 * undici's Agent loads at the first guarded request: a gateway or sandbox that never fetches
 * does not pay for it.
 */
function pinnedTo(target: CheckedTarget) {
  const pinned = (_host: string, opts: { all?: boolean }, cb: (...a: unknown[]) => void) =>
    opts.all ? cb(null, [{ address: target.address, family: target.family }]) : cb(null, target.address, target.family);
  const Agent = undiciAgent();
  return new Agent({ connect: { lookup: pinned } as object, connections: 1, pipelining: 0 });
}

/** The target's URL with its checked address in place of its name: what the tunnel is asked for. */
function addressed(target: CheckedTarget): URL {
  const url = new URL(target.url);
  url.hostname = target.family === 6 ? `[${target.address}]` : target.address;
  return url;
}

const require = createRequire(import.meta.url);

/**
 * A one-connection agent through `proxyUrl`'s CONNECT tunnel, for http:// targets too (undici's
 * proxyTunnel), so the proxy is given an address and a port, never a request to rewrite. The TLS
 * inside is named for the site (SNI and the certificate's check), unless the URL names an address.
 */
function tunnelTo(proxyUrl: string, target: CheckedTarget) {
  undiciAgent(); // the request API on every dispatcher, the proxy agent's among them
  const ProxyAgent = require("undici/lib/dispatcher/proxy-agent.js") as typeof import("undici").ProxyAgent;
  const host = target.url.hostname.replace(/^\[|\]$/g, "");
  return new ProxyAgent({
    uri: proxyUrl,
    proxyTunnel: true,
    connections: 1,
    pipelining: 0,
    ...(isIP(host) === 0 ? { requestTls: { servername: host } } : {}),
  });
}
