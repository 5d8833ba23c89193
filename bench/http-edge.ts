// bench/http-edge: what the HTTP face costs a call. The same unary call (GetHistory of a session
// with one exchange, which goes gateway -> runner) made against the real stack three ways in
// one run: through the gateway's gRPC port (the baseline: the API as gRPC clients see it);
// through the HTTP address as Connect JSON over HTTP/1.1 with fetch, as curl or a browser would;
// and as Connect binary over HTTP/2 with Connect's own client. The HTTP ways pass each call on
// to the gateway's gRPC server over its Unix socket (gateway/http/edge.ts), so the difference is that
// hop plus the JSON. One call at a time, then 16 at a time.
//
//   node dist/bench/http-edge.js [--calls 3000]
import { parseArgs } from "node:util";
import { createClient as createConnectClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { LOAD_QUOTAS, startStack } from "../test/helpers/stack.js";
import { measure, type Measured } from "./support/stats.js";

const { values } = parseArgs({ options: { calls: { type: "string", default: "3000" } } });
const N = Number(values.calls);

const stack = await startStack({
  services: ["model-server", "router", "memory", "runner", "gateway"],
  env: { ...LOAD_QUOTAS, TROUPE_MEMORY_LEARN: "0", TROUPE_SESSION_RATE: "100000", TROUPE_SESSION_BURST: "100000" },
});
const headers = { authorization: `Bearer ${stack.apiKey}` };
const base = `http://${stack.addr.http}`;

try {
  const { session } = await stack.gateway.createSession({});
  const sessionId = session!.sessionId;
  const sent = await stack.gateway.sendMessage({ sessionId, frameId: "b1", text: "hello" });
  for await (const { event } of stack.gateway.subscribe({ sessionId, afterSeq: sent.accepted!.seq }))
    if (event?.payload.case === "agentEnd") break;

  const viaGrpc = async () => {
    const h = await stack.gateway.getHistory({ sessionId });
    if (h.messages.length !== 2) throw new Error("bad answer");
  };
  const body = JSON.stringify({ sessionId });
  const viaJson = async () => {
    const res = await fetch(`${base}/troupe.v1.GatewayService/GetHistory`, {
      method: "POST",
      headers: { ...headers, "content-type": "application/json" },
      body,
    });
    const h = (await res.json()) as { messages: unknown[] };
    if (h.messages.length !== 2) throw new Error("bad answer");
  };
  const connect = createConnectClient(
    GatewayService,
    createConnectTransport({ baseUrl: base, httpVersion: "2", useBinaryFormat: true }),
  );
  const viaH2 = async () => {
    const h = await connect.getHistory({ sessionId }, { headers });
    if (h.messages.length !== 2) throw new Error("bad answer");
  };

  for (const fn of [viaGrpc, viaJson, viaH2]) await measure(fn, 300, 4); // warm-up
  const fmt = (m: Measured) => `p50 ${m.p50.toFixed(2)} ms, p99 ${m.p99.toFixed(2)} ms, ${Math.round(m.perSec)}/s`;
  const rows: [string, () => Promise<void>][] = [
    ["gRPC port (baseline)", viaGrpc],
    ["HTTP/1.1 Connect JSON (fetch)", viaJson],
    ["HTTP/2 Connect binary", viaH2],
  ];
  const results = new Map<string, { one: Measured; many: Measured }>();
  for (const [name, fn] of rows) results.set(name, { one: await measure(fn, N, 1), many: await measure(fn, N, 16) });
  for (const [name, r] of results) console.log(`${name}: one at a time ${fmt(r.one)}; 16 at a time ${fmt(r.many)}`);
  const g = results.get("gRPC port (baseline)")!;
  const j = results.get("HTTP/1.1 Connect JSON (fetch)")!;
  const h = results.get("HTTP/2 Connect binary")!;
  console.log(
    `RESULT json_p50_ms=${j.one.p50.toFixed(2)} h2_p50_ms=${h.one.p50.toFixed(2)} baseline_p50_ms=${g.one.p50.toFixed(2)} json_per_s=${Math.round(j.many.perSec)} h2_per_s=${Math.round(h.many.perSec)} baseline_per_s=${Math.round(g.many.perSec)} ratio_json=${(j.many.perSec / g.many.perSec).toFixed(2)} ratio_h2=${(h.many.perSec / g.many.perSec).toFixed(2)}`,
  );
} finally {
  await stack.stop();
}
