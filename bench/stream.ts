// bench/stream: S concurrent sessions, each streaming T tokens from the scripted model through
// client -> gateway -> runner, against (in the same run) a raw single-hop grpc-js stream carrying
// the same number of messages. Each token carries the model server's write time, so latency is
// measured from the model server's write to the client's receipt.
//
// Two Troupe figures are printed. "warm": the S session streams are open (as in a conversation
// under way) and the clock runs from the prompts to the last token; this is the one compared
// with the raw stream, whose clock also starts with streams that need no setup. "cold": the
// clock also covers creating S new sessions at once (routing, session logs, fsyncs).
// The raw rounds each start once every process of the stack is quiet; Troupe's three warm rounds
// run back to back, as under steady load, so background work a round leaves (learning from its
// turns) competes with the next one, as it would for users.
//
// The paced mode measures what users feel: P sessions (--paced-sessions, 1,000) each streaming
// at R tokens/s (--rate, 30) for D seconds (--seconds, 30), as real models stream. Its figures
// are the delay added to each token (model write -> client receipt, p50 and p99) and the CPU
// the gateway and runner spend per 1,000 tokens, beside a raw grpc-js stream carrying the same
// paced load (its delay, and its server's CPU). --mode burst|paced|both (both).
// Each mode also says whether the machine was quiet while it ran (support/machine.ts: other
// processes' CPU and the hypervisor's steal); RESULT's `quiet` is yes only if both were.
// The runner reaches the scripted model over plain HTTP/1.1, as it reaches a local model server;
// --model-tls makes it HTTPS offering h2, as hosted APIs are reached, where the runner's client
// takes HTTP/2 and the replies share connections (RESULT's `model` says which).
//
//   node dist/bench/stream.js [--sessions 200] [--tokens 200] [--paced-sessions 1000] [--rate 30] [--seconds 30]
//     [--mode both|burst|paced] [--model-tls]
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import type { ChatResponse } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { createClient, type ServiceClient } from "../services/shared/rpc.js";
import { caAndServer } from "../test/helpers/certs.js";
import { LOAD_QUOTAS, startStack } from "../test/helpers/stack.js";
import { cpuMs, waitQuiet } from "./support/cpu.js";
import { describeLoad, watchMachine } from "./support/machine.js";
import { startRaw } from "./support/raw-grpc.js";
import { median, pct } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    sessions: { type: "string", default: "200" },
    tokens: { type: "string", default: "200" },
    "paced-sessions": { type: "string", default: "1000" },
    rate: { type: "string", default: "30" },
    seconds: { type: "string", default: "30" },
    mode: { type: "string", default: "both" },
    "model-tls": { type: "boolean", default: false },
  },
});
const S = Number(values.sessions);
const T = Number(values.tokens);
const PACED = {
  sessions: Number(values["paced-sessions"]),
  rate: Number(values.rate),
  seconds: Number(values.seconds),
};
const MODE = values.mode;
const now = () => performance.timeOrigin + performance.now();

type Gateway = ServiceClient<(typeof GatewayService)["method"]>;

interface TroupeFigures {
  tokensPerS: number;
  eventsPerS: number;
  latencies: number[];
  /** When each of `latencies` arrived, in ms since the prompts went out. */
  arrivals: number[];
  /** CPU ms of the charged processes per 1,000 tokens. */
  cpuPer1000: number;
  /** Why the runs that did not complete ended (tolerated in the paced mode only). */
  failures: string[];
}

/**
 * Opens n sessions, then (if warm) starts the clock; sends each the prompt `!bench T` (or the
 * paced one). `cpu`: the processes whose CPU time the run is charged.
 */
async function troupeRun(
  clients: Gateway[],
  warm: boolean,
  n = S,
  prompt = `!bench ${T}`,
  cpu: number[] = [],
  tolerant = false,
): Promise<TroupeFigures> {
  const perSession = Number(/!bench (\d+)/.exec(prompt)![1]);
  const latencies: number[] = [];
  const arrivals: number[] = [];
  const failures: string[] = [];
  let tokens = 0;
  let deltaEvents = 0;
  const sessions = Array.from({ length: n }, (_, i) => {
    const call = clients[i % clients.length].chat();
    let opened!: () => void;
    let ended!: () => void;
    const isOpen = new Promise<void>((r) => (opened = r));
    // A stream cut by the server (an overloaded one evicts readers that fell 30 s behind) counts
    // as a failed run: the burst mode fails on any, the paced mode reports how many.
    const isDone = new Promise<void>((resolve) => {
      ended = resolve;
      call.on("error", (err: Error) => {
        failures.push(err.message);
        resolve();
      });
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
          arrivals.push(t);
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
  const cpu0 = cpuMs(cpu);
  const sent = now();
  for (const s of sessions)
    s.call.write({ frame: { frameId: "p", kind: { case: "prompt", value: { text: prompt } } } });
  await Promise.all(sessions.map((s) => s.isDone));
  const seconds = (performance.now() - t0) / 1000;
  const cpuPer1000 = ((cpuMs(cpu) - cpu0) / Math.max(1, tokens)) * 1000;
  if (!tolerant && failures.length > 0)
    throw new Error(`${failures.length} runs did not complete, e.g. ${failures[0]}`);
  if (!tolerant && tokens !== n * perSession) throw new Error(`expected ${n * perSession} tokens, received ${tokens}`);
  for (let i = 0; i < arrivals.length; i++) arrivals[i] -= sent;
  return { tokensPerS: tokens / seconds, eventsPerS: deltaEvents / seconds, latencies, arrivals, cpuPer1000, failures };
}

/**
 * The delay's p99 in each fifth of the run, by arrival: says whether a tail comes from the
 * sessions' start (every turn begins at once) or lasts through the streams.
 */
function timeline(run: TroupeFigures): string {
  const end = run.arrivals.reduce((a, b) => Math.max(a, b), 0);
  if (!(end > 0)) return "no tokens";
  const parts: number[][] = [[], [], [], [], []];
  for (let i = 0; i < run.arrivals.length; i++)
    parts[Math.min(4, Math.floor((Math.max(0, run.arrivals[i]) / end) * 5))].push(run.latencies[i]);
  // A fifth with no token (streams cut in the tolerant paced mode) says so rather than failing.
  const p99 = (d: number[]) => (d.length > 0 ? `p99=${pct(d, 99).toFixed(0)} ms` : "no tokens");
  return parts
    .map((d, i) => `${((i * end) / 5000).toFixed(0)}-${(((i + 1) * end) / 5000).toFixed(0)} s ${p99(d)}`)
    .join(", ");
}

const ROUNDS = 3;
/** This process's CPU time so far (user + system), in ms. */
const clientCpuMs = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
};
const SERVICE_KEYS = ["gateway", "router", "runner", "memory", "sandbox"];

const certDir = values["model-tls"] ? await mkdtemp(path.join(os.tmpdir(), "troupe-bench-model-")) : undefined;
if (certDir) caAndServer(certDir, "model");
const stack = await startStack({
  env: { ...LOAD_QUOTAS, TROUPE_LOG_LEVEL: "warn", ...JSON.parse(process.env.BENCH_ENV ?? "{}") },
  modelServerTls: certDir
    ? {
        cert: path.join(certDir, "model.pem"),
        key: path.join(certDir, "model.key"),
        ca: path.join(certDir, "model-ca.pem"),
      }
    : undefined,
});
try {
  const model = certDir ? "h2" : "http1";
  console.log(
    `the scripted model server: ${model === "h2" ? "HTTPS, h2 offered (as hosted APIs)" : "plain HTTP/1.1 (as local model servers)"}`,
  );
  // Clients as users have them: a few connections, many streams on each.
  const clients = Array.from({ length: 4 }, () =>
    createClient(GatewayService, stack.addr.gateway, { headers: { authorization: `Bearer ${stack.apiKey}` } }),
  );
  const raw = await startRaw(S);
  await raw.run(20); // warm-up: JIT and connections on both sides
  await troupeRun(clients, true);
  const result: Record<string, string> = {};
  // Every process of the stack, the model server's too: the raw stream is measured once they are quiet.
  const stackPids = [...SERVICE_KEYS, "model-server"].flatMap((k) => stack.process(k)?.pid ?? []);
  // Everything this benchmark runs, for telling its own CPU from the rest of the machine's.
  const benchCpuMs = () => cpuMs([...stackPids, raw.pid]) + clientCpuMs();
  const loads: boolean[] = [];
  const phase = (name: string) => {
    const watch = watchMachine(benchCpuMs);
    return () => {
      const load = watch.end();
      loads.push(load.quiet);
      console.log(describeLoad(name, load));
    };
  };
  if (MODE !== "paced") {
    // Rounds compared by their medians. The raw stream is measured on a quiet machine: Troupe's
    // background work (learning from the turns just run, which waits while the runner is busy)
    // must not be charged to it. Troupe's rounds run back to back, as under steady load, so
    // whatever one round leaves running competes with the next, as it would for users.
    const rawRates: number[] = [];
    const warmRuns: TroupeFigures[] = [];
    const burstEnded = phase("the burst");
    for (let i = 0; i < ROUNDS; i++) {
      await waitQuiet(stackPids);
      rawRates.push(await raw.run(T));
    }
    for (let i = 0; i < ROUNDS; i++) warmRuns.push(await troupeRun(clients, true));
    const cold = await troupeRun(clients, false);
    burstEnded();
    const rawRate = median(rawRates);
    const warmRate = median(warmRuns.map((r) => r.tokensPerS));
    const latencies = warmRuns.flatMap((r) => r.latencies);
    const p99 = pct(latencies, 99);
    const events = median(warmRuns.map((r) => r.eventsPerS));
    console.log(`burst: sessions=${S} tokens/session=${T} total=${S * T} rounds=${ROUNDS} (medians)`);
    console.log(
      `raw grpc-js single hop (own process): ${rawRate.toFixed(0)} messages/s   [rounds: ${rawRates.map((r) => r.toFixed(0)).join(", ")}]`,
    );
    console.log(
      `troupe warm (sessions open): ${warmRate.toFixed(0)} token events/s, carried in ${events.toFixed(0)} message_update events/s   [rounds: ${warmRuns.map((r) => r.tokensPerS.toFixed(0)).join(", ")}]`,
    );
    console.log(
      `troupe cold (creating ${S} sessions too): ${cold.tokensPerS.toFixed(0)} token events/s; latency p50=${pct(cold.latencies, 50).toFixed(1)} ms p99=${pct(cold.latencies, 99).toFixed(1)} ms`,
    );
    console.log(
      `latency model write -> client receipt (warm): p50=${pct(latencies, 50).toFixed(1)} ms p99=${p99.toFixed(1)} ms`,
    );
    result.stream_ratio = (warmRate / rawRate).toFixed(2);
    result.p99_ms = p99.toFixed(1);
  }
  if (MODE !== "burst") {
    const { sessions: n, rate, seconds } = PACED;
    const count = rate * seconds;
    const asked = n * rate;
    await waitQuiet(stackPids);
    const pacedEnded = phase("the paced runs");
    const rawPaced = await raw.paced(n, count, rate);
    const pids = ["gateway", "runner"].map((k) => stack.process(k)!.pid!);
    const modelPid = [stack.process("model-server")!.pid!];
    // Where the machine's cores went: each process of the path, and this client's own.
    const cpuOf = () => [...pids.map((p) => cpuMs([p])), cpuMs(modelPid), clientCpuMs()];
    const cpuBefore = cpuOf();
    const troupe = await troupeRun(clients, true, n, `!bench ${count} rate=${rate}`, pids, true);
    const [gatewayMs, runnerMs, modelMs, clientMs] = cpuOf().map((ms, i) => ms - cpuBefore[i]);
    pacedEnded();
    const modelPer1000 = (modelMs / (n * count)) * 1000;
    const perToken = (ms: number) => ((ms / Math.max(1, troupe.latencies.length)) * 1000).toFixed(0);
    const p50 = pct(troupe.latencies, 50);
    const p99 = pct(troupe.latencies, 99);
    console.log(`paced: sessions=${n} at ${rate} tokens/s for ${seconds} s (${asked} tokens/s asked)`);
    console.log(
      `raw grpc-js, same paced load: ${rawPaced.tokensPerS.toFixed(0)} messages/s, delay p50=${pct(rawPaced.latencies, 50).toFixed(1)} ms p99=${pct(rawPaced.latencies, 99).toFixed(1)} ms, server CPU ${rawPaced.cpuPer1000.toFixed(0)} ms per 1,000`,
    );
    console.log(
      `troupe: ${troupe.tokensPerS.toFixed(0)} tokens/s delivered, delay model write -> client p50=${p50.toFixed(1)} ms p99=${p99.toFixed(1)} ms, gateway+runner CPU ${troupe.cpuPer1000.toFixed(0)} ms per 1,000 tokens (the scripted model server's: ${modelPer1000.toFixed(0)} ms)`,
    );
    console.log(
      `troupe: CPU per 1,000 tokens delivered: gateway ${perToken(gatewayMs)} ms, runner ${perToken(runnerMs)} ms, model server ${perToken(modelMs)} ms, this client ${perToken(clientMs)} ms`,
    );
    // Delivered tokens/s is over the whole run, each session's start and end included; this says
    // whether any token was missing, and how long the run took beside the streams' own length.
    const wallS = troupe.latencies.length / troupe.tokensPerS;
    console.log(
      `troupe: ${troupe.latencies.length} of ${n * count} tokens arrived, in ${wallS.toFixed(1)} s for streams of ${seconds} s (raw grpc-js: ${(rawPaced.latencies.length / rawPaced.tokensPerS).toFixed(1)} s)`,
    );
    console.log(`troupe: delay by when the token arrived: ${timeline(troupe)}`);
    if (troupe.failures.length > 0)
      console.log(`troupe: ${troupe.failures.length} of ${n} streams did not complete, e.g. ${troupe.failures[0]}`);
    result.paced_p50_ms = p50.toFixed(1);
    result.paced_p99_ms = p99.toFixed(1);
  }
  raw.stop();
  for (const c of clients) c.close();
  result.quiet = loads.every(Boolean) ? "yes" : "no";
  result.model = model;
  const order = ["stream_ratio", "paced_p50_ms", "paced_p99_ms", "p99_ms", "quiet", "model"].filter((k) => k in result);
  console.log(`RESULT ${order.map((k) => `${k}=${result[k]}`).join(" ")}`);
} finally {
  await stack.stop();
  if (certDir) await rm(certDir, { recursive: true, force: true });
}
