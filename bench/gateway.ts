// bench/gateway: what authentication and routing cost at the gateway.
//
// 1. The same unary call (SendMessage) and the same stream open (Chat: open, answer, end) against
//    three servers in one process of their own (bench/support/gateway-variants.ts): bare grpc-js,
//    Troupe's adapter without auth, and the adapter with the gateway's API-key check and a cached
//    session placement. Handlers do nothing else, so the difference between the last two is what
//    authentication and routing cost, compared with a bare grpc-js call. Rounds are interleaved
//    and compared by their medians.
// 2. A cached placement lookup, in-process (the gateway asks the router once per session).
// 3. For scale, the real stack with authentication on: SendMessage and Chat opens per second.
//
//   node dist/bench/gateway.js [--calls 20000] [--concurrency 64]
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";
import { PlacementCache } from "../services/gateway/placement.js";
import { sha256 } from "../services/shared/auth/api-keys.js";
import {
  ChatRequestSchema,
  GatewayService,
  SendMessageRequestSchema,
} from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { LOAD_QUOTAS, startStack } from "../test/helpers/stack.js";
import { median, pct } from "./support/stats.js";

const { values } = parseArgs({
  options: { calls: { type: "string", default: "20000" }, concurrency: { type: "string", default: "64" } },
});
const CALLS = Number(values.calls);
const CONCURRENCY = Number(values.concurrency);
const ROUNDS = 5;

const KEY = "trp_bench-key-0123456789abcdefghijklmnopqrstuvwxyz";
const keysJson = JSON.stringify({ keys: [{ id: "bench", tenant: "bench", principal: "bench", sha256: sha256(KEY) }] });
const same = (b: Buffer) => b;
const sendBody = Buffer.from(
  toBinary(SendMessageRequestSchema, create(SendMessageRequestSchema, { sessionId: "s1", frameId: "f", text: "hi" })),
);
const openBody = Buffer.from(
  toBinary(
    ChatRequestSchema,
    create(ChatRequestSchema, {
      frame: { frameId: "o", kind: { case: "open", value: { sessionId: "s1", create: true } } },
    }),
  ),
);

/** Runs `n` calls with `CONCURRENCY` in flight; returns calls per second. */
async function drive(n: number, one: () => Promise<void>): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next++ < n) await one();
    }),
  );
  return n / ((performance.now() - t0) / 1000);
}

function rawCalls(address: string, authorized: boolean) {
  const client = new grpc.Client(address, grpc.credentials.createInsecure());
  const md = new grpc.Metadata();
  if (authorized) md.set("authorization", `Bearer ${KEY}`);
  return {
    unary: () =>
      new Promise<void>((resolve, reject) =>
        client.makeUnaryRequest("/troupe.v1.GatewayService/SendMessage", same, same, sendBody, md, (err) =>
          err ? reject(err) : resolve(),
        ),
      ),
    open: () =>
      new Promise<void>((resolve, reject) => {
        const call = client.makeBidiStreamRequest("/troupe.v1.GatewayService/Chat", same, same, md);
        call.on("data", () => undefined);
        call.on("error", reject);
        call.on("end", () => resolve());
        call.write(openBody);
        call.end();
      }),
    close: () => client.close(),
  };
}

// 1. The three servers.
const proc = spawn(
  process.execPath,
  [fileURLToPath(new URL("./support/gateway-variants.js", import.meta.url)), keysJson],
  { stdio: ["ignore", "pipe", "inherit"] },
);
const [line] = (await once(proc.stdout!, "data")) as [Buffer];
const ports = Object.fromEntries(
  line
    .toString()
    .trim()
    .split(" ")
    .map((kv) => kv.split("=")),
) as Record<"bare" | "adapter" | "auth", string>;
const variants = {
  bare: rawCalls(`127.0.0.1:${ports.bare}`, false),
  adapter: rawCalls(`127.0.0.1:${ports.adapter}`, false),
  auth: rawCalls(`127.0.0.1:${ports.auth}`, true),
};
type Name = keyof typeof variants;
const rates: Record<"unary" | "open", Record<Name, number[]>> = {
  unary: { bare: [], adapter: [], auth: [] },
  open: { bare: [], adapter: [], auth: [] },
};
for (const v of Object.values(variants)) {
  await drive(2000, v.unary); // warm-up: JIT, connections
  await drive(500, v.open);
}
for (let r = 0; r < ROUNDS; r++) {
  for (const name of Object.keys(variants) as Name[]) {
    rates.unary[name].push(await drive(CALLS, variants[name].unary));
    rates.open[name].push(await drive(Math.floor(CALLS / 4), variants[name].open));
  }
}
for (const v of Object.values(variants)) v.close();
proc.kill("SIGTERM");

const perCallUs = (xs: number[]) => 1e6 / median(xs);
const report = (what: "unary" | "open") => {
  const bare = perCallUs(rates[what].bare);
  const adapter = perCallUs(rates[what].adapter);
  const auth = perCallUs(rates[what].auth);
  const cost = auth - adapter;
  console.log(
    `${what === "unary" ? "unary SendMessage" : "Chat stream open "}: bare ${median(rates[what].bare).toFixed(0)}/s (${bare.toFixed(1)} us), adapter ${median(rates[what].adapter).toFixed(0)}/s (${adapter.toFixed(1)} us), adapter+auth+routing ${median(rates[what].auth).toFixed(0)}/s (${auth.toFixed(1)} us); auth+routing cost ${cost.toFixed(1)} us = ${((cost / bare) * 100).toFixed(1)}% of a bare call`,
  );
  return cost / bare;
};
console.log(`calls=${CALLS} concurrency=${CONCURRENCY} rounds=${ROUNDS} (medians; per-call time = 1 / throughput)`);
const unaryRatio = report("unary");
const openRatio = report("open");

// 2. A cached placement lookup.
const router = createClient(RouterService, "127.0.0.1:1");
const cache = new PlacementCache(router);
const SESSIONS = 10_000;
const BENCH_CALLER = { tenant: "bench", principal: "p" };
for (let i = 0; i < SESSIONS; i++)
  (cache as unknown as { entries: Map<string, unknown> }).entries.set(`bench/p/s${i}`, {
    sessionId: `s${i}`,
    agentId: "main",
    runner: { runnerId: "r", address: "a" },
  });
const samples: number[] = [];
for (let round = 0; round < 20; round++) {
  const t0 = performance.now();
  for (let i = 0; i < 50_000; i++) await cache.resolve(BENCH_CALLER, `s${(i * 7919) % SESSIONS}`, "");
  samples.push(((performance.now() - t0) * 1000) / 50_000);
}
router.close();
const resolveUs = median(samples);
console.log(
  `cached placement lookup (${SESSIONS} sessions cached): p50 ${resolveUs.toFixed(2)} us, p95 ${pct(samples, 95).toFixed(2)} us per lookup (await included)`,
);

// 3. The real stack, authentication on.
const stack = await startStack({
  services: ["model-server", "router", "runner", "gateway"],
  env: {
    ...LOAD_QUOTAS,
    TROUPE_LOG_LEVEL: "warn",
    TROUPE_MEMORY_CONTEXT_K: "0",
    TROUPE_SESSION_RATE: "100000",
    TROUPE_SESSION_BURST: "100000",
    TROUPE_TENANT_RATE: "100000",
    TROUPE_TENANT_BURST: "100000",
  },
});
try {
  const gw = createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${stack.apiKey}` } });
  await gw.createSession({ sessionId: "bench-1" });
  let n = 0;
  // Abort frames: admitted, logged and acknowledged, but start no model call, so this measures
  // the path through gateway and runner rather than the scripted model.
  const unary = await drive(5000, async () => {
    await gw.abort({ sessionId: "bench-1", frameId: `a${n++}` });
  });
  let m = 0;
  const opens = await drive(
    2000,
    () =>
      new Promise<void>((resolve, reject) => {
        const call = gw.chat();
        call.on("data", (r) => {
          if (r.kind.case === "opened") call.end();
        });
        call.on("error", reject);
        call.on("end", () => resolve());
        call.write({
          frame: { frameId: "o", kind: { case: "open", value: { sessionId: `open-${m++}`, create: true } } },
        });
      }),
  );
  console.log(
    `real stack, authentication on: ${unary.toFixed(0)} unary calls/s (Abort: gateway + runner + fsynced log), ${opens.toFixed(0)} new sessions opened/s over Chat`,
  );
  gw.close();
} finally {
  await stack.stop();
}
console.log(
  `RESULT auth_overhead_ratio=${Math.max(unaryRatio, openRatio).toFixed(3)} resolve_cached_us=${resolveUs.toFixed(2)}`,
);
