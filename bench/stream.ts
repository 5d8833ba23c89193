// bench/stream: S concurrent sessions, each streaming T tokens from the scripted model through
// client -> gateway -> runner, against (in the same run) a raw single-hop grpc-js stream carrying
// the same number of messages. Each token carries the model server's write time, so latency is
// measured from the model server's write to the client's receipt.
//
//   node dist/bench/stream.js [--sessions 200] [--tokens 200]
import { spawn } from "node:child_process";
import { once } from "node:events";
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import type { ChatResponse } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { startStack } from "../test/helpers/stack.js";

const { values } = parseArgs({ options: { sessions: { type: "string", default: "200" }, tokens: { type: "string", default: "200" } } });
const S = Number(values.sessions);
const T = Number(values.tokens);
const now = () => performance.timeOrigin + performance.now();
const pct = (xs: number[], p: number) => xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

async function troupeRun(address: string): Promise<{ tokensPerS: number; eventsPerS: number; latencies: number[]; ttft: number[] }> {
  // Clients as users have them: a few connections, many streams on each.
  const clients = Array.from({ length: 4 }, () => createClient(GatewayService, address));
  const latencies: number[] = [];
  const ttft: number[] = [];
  let tokens = 0;
  let deltaEvents = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: S }, (_, i) =>
      new Promise<void>((resolve, reject) => {
        const call = clients[i % clients.length].chat();
        const sent = performance.now();
        let first = true;
        call.on("data", (resp: ChatResponse) => {
          if (resp.kind.case !== "event") return;
          const p = resp.kind.value.payload;
          if (p.case === "messageUpdate" && p.value.delta.case === "text") {
            const t = now();
            if (first) {
              first = false;
              ttft.push(performance.now() - sent);
            }
            deltaEvents++;
            for (const m of p.value.delta.value.matchAll(/@(\d+\.\d+) /g)) {
              latencies.push(t - Number(m[1]));
              tokens++;
            }
          } else if (p.case === "agentEnd") {
            call.end();
          }
        });
        call.on("end", () => resolve());
        call.on("error", reject);
        call.write({ frame: { frameId: "o", kind: { case: "open", value: { create: true } } } });
        call.write({ frame: { frameId: "p", kind: { case: "prompt", value: { text: `!bench ${T}` } } } });
      }),
    ),
  );
  const seconds = (performance.now() - t0) / 1000;
  for (const c of clients) c.close();
  if (tokens !== S * T) throw new Error(`expected ${S * T} tokens, received ${tokens}`);
  return { tokensPerS: tokens / seconds, eventsPerS: deltaEvents / seconds, latencies, ttft };
}

async function rawRun(): Promise<{ msgsPerS: number }> {
  const server = spawn(process.execPath, [fileURLToPath(new URL("./raw-grpc-server.js", import.meta.url))], { stdio: ["ignore", "pipe", "inherit"] });
  const [line] = (await once(server.stdout!, "data")) as [Buffer];
  const address = `127.0.0.1:${line.toString().trim()}`;
  const clients = Array.from({ length: 4 }, () => new grpc.Client(address, grpc.credentials.createInsecure()));
  const identity = (b: Buffer) => b;
  let received = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: S }, (_, i) =>
      new Promise<void>((resolve, reject) => {
        const call = clients[i % clients.length].makeBidiStreamRequest("/bench.Raw/Stream", identity, identity);
        call.on("data", () => received++);
        call.on("end", () => resolve());
        call.on("error", reject);
        const req = Buffer.alloc(4);
        req.writeUInt32BE(T);
        call.write(req);
        call.end();
      }),
    ),
  );
  const seconds = (performance.now() - t0) / 1000;
  for (const c of clients) c.close();
  server.kill("SIGTERM");
  if (received !== S * T) throw new Error(`raw: expected ${S * T} messages, received ${received}`);
  return { msgsPerS: received / seconds };
}

const stack = await startStack({ services: ["model-server", "router", "memory", "sandbox", "runner", "gateway"], env: { TROUPE_LOG_LEVEL: "warn", ...JSON.parse(process.env.BENCH_ENV ?? "{}") } });
try {
  // A short warm-up so both sides run with JIT-compiled code and open connections.
  const warm = await troupeRunSafe(stack.addr.gateway, 20, 20);
  void warm;
  const raw = await rawRun();
  const troupe = await troupeRun(stack.addr.gateway);
  troupe.latencies.sort((a, b) => a - b);
  const p50 = pct(troupe.latencies, 50);
  const p99 = pct(troupe.latencies, 99);
  const ratio = troupe.tokensPerS / raw.msgsPerS;
  console.log(`sessions=${S} tokens/session=${T} total=${S * T}`);
  console.log(`raw grpc-js single hop: ${raw.msgsPerS.toFixed(0)} messages/s`);
  console.log(`troupe client<-gateway<-runner: ${troupe.tokensPerS.toFixed(0)} token events/s in ${troupe.eventsPerS.toFixed(0)} message_update events/s (${(troupe.tokensPerS / troupe.eventsPerS).toFixed(1)} tokens per coalesced event)`);
  console.log(`latency model write -> client receipt: p50=${p50.toFixed(1)} ms p99=${p99.toFixed(1)} ms`);
  troupe.ttft.sort((a, b) => a - b);
  console.log(`time to first token (open + prompt -> first delta): p50=${pct(troupe.ttft, 50).toFixed(0)} ms p99=${pct(troupe.ttft, 99).toFixed(0)} ms`);
  console.log(`RESULT stream_ratio=${ratio.toFixed(2)} p99_ms=${p99.toFixed(1)}`);
} finally {
  await stack.stop();
}

async function troupeRunSafe(address: string, s: number, t: number) {
  const [S0, T0] = [S, T];
  void S0;
  void T0;
  const clients = createClient(GatewayService, address);
  await Promise.all(
    Array.from({ length: s }, () =>
      new Promise<void>((resolve, reject) => {
        const call = clients.chat();
        call.on("data", (resp: ChatResponse) => resp.kind.case === "event" && resp.kind.value.payload.case === "agentEnd" && call.end());
        call.on("end", () => resolve());
        call.on("error", reject);
        call.write({ frame: { frameId: "o", kind: { case: "open", value: { create: true } } } });
        call.write({ frame: { frameId: "p", kind: { case: "prompt", value: { text: `!bench ${t}` } } } });
      }),
    ),
  );
  clients.close();
}
