// bench/stream: S concurrent sessions, each streaming T tokens from the scripted model through
// client -> gateway -> runner, against (in the same run) a raw single-hop grpc-js stream carrying
// the same number of messages. Each token carries the model server's write time, so latency is
// measured from the model server's write to the client's receipt.
//
// Two Troupe figures are printed. "warm": the S session streams are open (as in a conversation
// under way) and the clock runs from the prompts to the last token; this is the one compared
// with the raw stream, whose clock also starts with streams that need no setup. "cold": the
// clock also covers creating S new sessions at once (routing, session logs, fsyncs).
//
//   node dist/bench/stream.js [--sessions 200] [--tokens 200]
import { spawn } from "node:child_process";
import { once } from "node:events";
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import type { ChatResponse } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { createClient, type ServiceClient } from "../services/shared/rpc.js";
import { LOAD_QUOTAS, startStack } from "../test/helpers/stack.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: { sessions: { type: "string", default: "200" }, tokens: { type: "string", default: "200" } },
});
const S = Number(values.sessions);
const T = Number(values.tokens);
const now = () => performance.timeOrigin + performance.now();

type Gateway = ServiceClient<(typeof GatewayService)["method"]>;

interface TroupeFigures {
  tokensPerS: number;
  eventsPerS: number;
  latencies: number[];
}

/** Opens S sessions, then (if warm) starts the clock; sends one `!bench T` prompt to each. */
async function troupeRun(clients: Gateway[], warm: boolean): Promise<TroupeFigures> {
  const latencies: number[] = [];
  const failures: string[] = [];
  let tokens = 0;
  let deltaEvents = 0;
  const sessions = Array.from({ length: S }, (_, i) => {
    const call = clients[i % clients.length].chat();
    let opened!: () => void;
    let ended!: () => void;
    const isOpen = new Promise<void>((r) => (opened = r));
    const isDone = new Promise<void>((resolve, reject) => {
      ended = resolve;
      call.on("error", reject);
    });
    call.on("data", (resp: ChatResponse) => {
      if (resp.kind.case === "opened") return opened();
      if (resp.kind.case !== "event") return;
      const p = resp.kind.value.payload;
      if (p.case === "messageUpdate" && p.value.delta.case === "text") {
        const t = now();
        deltaEvents++;
        for (const m of p.value.delta.value.matchAll(/@(\d+\.\d+) /g)) {
          latencies.push(t - Number(m[1]));
          tokens++;
        }
      } else if (p.case === "agentEnd") {
        if (p.value.stopReason !== StopReason.COMPLETED)
          failures.push(`${StopReason[p.value.stopReason]}: ${p.value.errorMessage}`);
        call.end();
      }
    });
    call.on("end", () => ended());
    return { call, isOpen, isDone };
  });
  let t0 = performance.now();
  for (const s of sessions) s.call.write({ frame: { frameId: "o", kind: { case: "open", value: { create: true } } } });
  if (warm) {
    await Promise.all(sessions.map((s) => s.isOpen));
    t0 = performance.now();
  }
  for (const s of sessions)
    s.call.write({ frame: { frameId: "p", kind: { case: "prompt", value: { text: `!bench ${T}` } } } });
  await Promise.all(sessions.map((s) => s.isDone));
  const seconds = (performance.now() - t0) / 1000;
  if (failures.length > 0) throw new Error(`${failures.length} runs did not complete, e.g. ${failures[0]}`);
  if (tokens !== S * T) throw new Error(`expected ${S * T} tokens, received ${tokens}`);
  return { tokensPerS: tokens / seconds, eventsPerS: deltaEvents / seconds, latencies };
}

/** The raw baseline: a bare grpc-js server process; `run(n)` streams n messages on each of S streams. */
async function startRaw(): Promise<{ run(n: number): Promise<number>; stop(): void }> {
  const server = spawn(process.execPath, [fileURLToPath(new URL("./support/raw-grpc-server.js", import.meta.url))], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const [line] = (await once(server.stdout!, "data")) as [Buffer];
  const address = `127.0.0.1:${line.toString().trim()}`;
  const clients = Array.from({ length: 4 }, () => new grpc.Client(address, grpc.credentials.createInsecure()));
  const identity = (b: Buffer) => b;
  const run = async (n: number) => {
    let received = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from(
        { length: S },
        (_, i) =>
          new Promise<void>((resolve, reject) => {
            const call = clients[i % clients.length].makeBidiStreamRequest("/bench.Raw/Stream", identity, identity);
            call.on("data", () => received++);
            call.on("end", () => resolve());
            call.on("error", reject);
            const req = Buffer.alloc(4);
            req.writeUInt32BE(n);
            call.write(req);
            call.end();
          }),
      ),
    );
    if (received !== S * n) throw new Error(`raw: expected ${S * n} messages, received ${received}`);
    return received / ((performance.now() - t0) / 1000);
  };
  return {
    run,
    stop() {
      for (const c of clients) c.close();
      server.kill("SIGTERM");
    },
  };
}

const ROUNDS = 3;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const stack = await startStack({
  env: { ...LOAD_QUOTAS, TROUPE_LOG_LEVEL: "warn", ...JSON.parse(process.env.BENCH_ENV ?? "{}") },
});
try {
  // Clients as users have them: a few connections, many streams on each.
  const clients = Array.from({ length: 4 }, () =>
    createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${stack.apiKey}` } }),
  );
  const raw = await startRaw();
  await raw.run(20); // warm-up: JIT and connections on both sides
  await troupeRun(clients, true);
  // Interleaved rounds, compared by their medians: this machine's noise hits both sides alike.
  const rawRates: number[] = [];
  const warmRuns: TroupeFigures[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    rawRates.push(await raw.run(T));
    warmRuns.push(await troupeRun(clients, true));
  }
  raw.stop();
  const cold = await troupeRun(clients, false);
  for (const c of clients) c.close();
  const rawRate = median(rawRates);
  const warmRate = median(warmRuns.map((r) => r.tokensPerS));
  const latencies = warmRuns.flatMap((r) => r.latencies);
  const p50 = pct(latencies, 50);
  const p99 = pct(latencies, 99);
  const events = median(warmRuns.map((r) => r.eventsPerS));
  const ratio = warmRate / rawRate;
  console.log(`sessions=${S} tokens/session=${T} total=${S * T} rounds=${ROUNDS} (medians)`);
  console.log(
    `raw grpc-js single hop (own process): ${rawRate.toFixed(0)} messages/s   [rounds: ${rawRates.map((r) => r.toFixed(0)).join(", ")}]`,
  );
  console.log(
    `troupe warm (sessions open): ${warmRate.toFixed(0)} token events/s, carried in ${events.toFixed(0)} message_update events/s   [rounds: ${warmRuns.map((r) => r.tokensPerS.toFixed(0)).join(", ")}]`,
  );
  console.log(
    `troupe cold (creating ${S} sessions too): ${cold.tokensPerS.toFixed(0)} token events/s; latency p50=${pct(cold.latencies, 50).toFixed(1)} ms p99=${pct(cold.latencies, 99).toFixed(1)} ms`,
  );
  console.log(`latency model write -> client receipt (warm): p50=${p50.toFixed(1)} ms p99=${p99.toFixed(1)} ms`);
  console.log(`RESULT stream_ratio=${ratio.toFixed(2)} p99_ms=${p99.toFixed(1)}`);
} finally {
  await stack.stop();
}
