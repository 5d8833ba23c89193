// bench/web-fetch: what the SSRF guard costs a request. The same local page (a small HTML page
// on 127.0.0.2, which the policy treats as public) fetched through guardedRequest (the URL and
// its name checked, a fresh connection pinned to the checked address, no keep-alive across
// calls) and, as the baseline in the same run, through undici's request with one shared Agent
// (keep-alive, no checks). Sequential requests, then 16 at a time.
//
//   node dist/bench/web-fetch.js [--requests 2000]
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { Agent, request } from "undici";
import { guardedRequest, type NetPolicy } from "../services/shared/net/net-guard.js";
import { measure, type Measured } from "./support/stats.js";

const { values } = parseArgs({ options: { requests: { type: "string", default: "2000" } } });
const N = Number(values.requests);
const page = `<html><body><h1>Bench</h1>${"<p>some words in a paragraph</p>".repeat(100)}</body></html>`;
const server = createServer((_req, res) => res.writeHead(200, { "content-type": "text/html" }).end(page));
await new Promise<void>((r) => server.listen(0, "127.0.0.2", r));
const port = (server.address() as AddressInfo).port;
const url = `http://bench.test:${port}/`;
const policy: NetPolicy = {
  ports: [port],
  allow: ["127.0.0.2/32"],
  maxRedirects: 5,
  resolve: async () => [{ address: "127.0.0.2", family: 4 }],
};
const pinned = (_host: string, _opts: object, cb: (err: null, a: { address: string; family: number }[]) => void) =>
  cb(null, [{ address: "127.0.0.2", family: 4 }]);
const shared = new Agent({ connect: { lookup: pinned } as object });

const guarded = async () => {
  const r = await guardedRequest(url, { maxBytes: 1 << 20, timeoutMs: 10_000 }, policy);
  if (r.status !== 200 || r.body.length !== page.length) throw new Error("bad answer");
};
const plain = async () => {
  const r = await request(url, { dispatcher: shared });
  const body = await r.body.text();
  if (r.statusCode !== 200 || body.length !== page.length) throw new Error("bad answer");
};

try {
  await measure(guarded, 200, 4); // warm-up, both paths
  await measure(plain, 200, 4);
  const fmt = (m: Measured) => `p50 ${m.p50.toFixed(2)} ms, p99 ${m.p99.toFixed(2)} ms, ${Math.round(m.perSec)}/s`;
  const g1 = await measure(guarded, N, 1);
  const p1 = await measure(plain, N, 1);
  const g16 = await measure(guarded, N, 16);
  const p16 = await measure(plain, N, 16);
  console.log(`sequential: guarded ${fmt(g1)}; undici keep-alive ${fmt(p1)}`);
  console.log(`16 at a time: guarded ${fmt(g16)}; undici keep-alive ${fmt(p16)}`);
  console.log(
    `RESULT guarded_p50_ms=${g1.p50.toFixed(2)} baseline_p50_ms=${p1.p50.toFixed(2)} guarded_per_s=${Math.round(g16.perSec)} baseline_per_s=${Math.round(p16.perSec)} ratio=${(g16.perSec / p16.perSec).toFixed(2)}`,
  );
} finally {
  await shared.close();
  server.close();
}
