// bench/stream-floor: what bench/stream's paced load costs this machine with no Troupe code on
// its path, so that Troupe's paced figures can be read against the least its topology allows.
//
// The path is bench/stream's: P client streams (four connections, as there) -> a gateway process
// -> a runner process -> the scripted model server (the same one, the same `!bench N rate=R`
// prompt, one HTTP connection per reply). The gateway and runner here are floor relays
// (support/floor-relay.ts): the runner parses each SSE chunk's JSON and writes its text as one
// gRPC message; the gateway pipes bytes. So what it measures is the hops themselves: what any
// design with these processes pays before it does anything of its own.
//
// In the same run, beside it: the raw grpc-js single hop carrying the same paced load (the
// baseline of bench/stream). Prints each process's CPU per 1,000 tokens, the delay added from the
// model's write to the client's receipt (p50, p99), and whether the machine was quiet.
//
//   node dist/bench/stream-floor.js [--paced-sessions 1000] [--rate 30] [--seconds 30]
import { parseArgs } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { startStack } from "../test/helpers/stack.js";
import { cpuMs, waitQuiet } from "./support/cpu.js";
import { FLOOR_METHOD } from "./support/floor-relay.js";
import { describeLoad, watchMachine } from "./support/machine.js";
import { startPortPrinter, startRaw } from "./support/raw-grpc.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    "paced-sessions": { type: "string", default: "1000" },
    rate: { type: "string", default: "30" },
    seconds: { type: "string", default: "30" },
  },
});
const SESSIONS = Number(values["paced-sessions"]);
const RATE = Number(values.rate);
const COUNT = RATE * Number(values.seconds);
const now = () => performance.timeOrigin + performance.now();
const identity = (b: Buffer) => b;
const clientCpuMs = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
};

/** `sessions` streams through a floor gateway; if `stamped`, each token's delay from its write to its receipt. */
async function floorRun(
  clients: grpc.Client[],
  sessions: number,
  prompt: string,
  stamped: boolean,
): Promise<{ latencies: number[]; seconds: number }> {
  const latencies: number[] = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from(
      { length: sessions },
      (_, i) =>
        new Promise<void>((resolve, reject) => {
          const call = clients[i % clients.length].makeBidiStreamRequest(FLOOR_METHOD, identity, identity);
          call.on("data", (b: Buffer) => {
            if (!stamped) return;
            const t = now();
            for (const m of b.toString("utf8").matchAll(/@(\d+\.\d+) /g)) latencies.push(t - Number(m[1]));
          });
          call.on("end", () => resolve());
          call.on("error", reject);
          call.write(Buffer.from(prompt));
          call.end();
        }),
    ),
  );
  if (stamped && latencies.length !== sessions * COUNT)
    throw new Error(`floor: expected ${SESSIONS * COUNT} tokens, received ${latencies.length}`);
  return { latencies, seconds: (performance.now() - t0) / 1000 };
}

/** The relays' CPU, for telling this benchmark's own CPU from the machine's: live ones, and those stopped. */
const relays = { live: [] as number[], stoppedMs: 0 };
const relaysCpuMs = () => relays.stoppedMs + cpuMs(relays.live);

interface FloorFigures {
  latencies: number[];
  seconds: number;
  /** CPU ms per 1,000 tokens: gateway relay, runner relay, model server, this client. */
  cpu: number[];
}

/** A floor path (relays of `kind`) over the model server: warmed, then the paced run, measured. */
async function measureFloor(kind: "" | "mux-", modelAddr: string, modelPid: number): Promise<FloorFigures> {
  const runner = await startPortPrinter("./floor-relay.js", [`${kind}runner`, `http://${modelAddr}`]);
  const gateway = await startPortPrinter("./floor-relay.js", [`${kind}gateway`, `127.0.0.1:${runner.port}`]);
  const clients = Array.from(
    { length: 4 },
    () => new grpc.Client(`127.0.0.1:${gateway.port}`, grpc.credentials.createInsecure()),
  );
  const relayPids = [gateway.proc.pid!, runner.proc.pid!];
  relays.live = relayPids;
  try {
    const pids = [...relayPids, modelPid];
    await floorRun(clients, 50, "!bench 200", false); // JIT, connections, the model server's pool
    await waitQuiet(pids);
    const cpuOf = () => [...pids.map((p) => cpuMs([p])), clientCpuMs()];
    const before = cpuOf();
    const run = await floorRun(clients, SESSIONS, `!bench ${COUNT} rate=${RATE}`, true);
    const cpu = cpuOf().map((ms, i) => ((ms - before[i]) / run.latencies.length) * 1000);
    return { ...run, cpu };
  } finally {
    for (const c of clients) c.close();
    relays.stoppedMs += cpuMs(relayPids);
    relays.live = [];
    gateway.proc.kill("SIGTERM");
    runner.proc.kill("SIGTERM");
  }
}

function report(name: string, f: FloorFigures): { p50: number; p99: number; total: number } {
  const p50 = pct(f.latencies, 50);
  const p99 = pct(f.latencies, 99);
  const total = f.cpu.reduce((a, b) => a + b, 0);
  const [g, r, m, c] = f.cpu.map((ms) => ms.toFixed(0));
  console.log(
    `${name}: ${(f.latencies.length / f.seconds).toFixed(0)} tokens/s delivered in ${f.seconds.toFixed(1)} s, delay p50=${p50.toFixed(1)} ms p99=${p99.toFixed(1)} ms; CPU per 1,000 tokens: gateway relay ${g} ms, runner relay ${r} ms, model server ${m} ms, this client ${c} ms; ${total.toFixed(0)} ms in all, ${((total * SESSIONS * RATE) / 1e6).toFixed(2)} cores at ${SESSIONS * RATE} tokens/s`,
  );
  return { p50, p99, total };
}

const stack = await startStack({ services: ["model-server"] });
const model = stack.process("model-server")!;
const raw = await startRaw(SESSIONS);
try {
  await raw.run(20);
  const modelAddr = stack.addr["model-server"];
  // Everything this benchmark runs, for telling its own CPU from the rest of the machine's.
  const watch = watchMachine(() => cpuMs([model.pid!, raw.pid]) + relaysCpuMs() + clientCpuMs());
  await waitQuiet([model.pid!, raw.pid]);
  const rawPaced = await raw.paced(SESSIONS, COUNT, RATE);
  const perStream = await measureFloor("", modelAddr, model.pid!);
  const muxed = await measureFloor("mux-", modelAddr, model.pid!);
  const load = watch.end();
  console.log(describeLoad("the paced runs", load));
  console.log(
    `paced: sessions=${SESSIONS} at ${RATE} tokens/s for ${values.seconds} s (${SESSIONS * RATE} tokens/s asked)`,
  );
  console.log(
    `raw grpc-js, same paced load: ${rawPaced.tokensPerS.toFixed(0)} messages/s, delay p50=${pct(rawPaced.latencies, 50).toFixed(1)} ms p99=${pct(rawPaced.latencies, 99).toFixed(1)} ms, server CPU ${rawPaced.cpuPer1000.toFixed(0)} ms per 1,000`,
  );
  const a = report("floor, a stream per session between the relays", perStream);
  const b = report("floor, one multiplexed stream between the relays", muxed);
  console.log(
    `RESULT floor_paced_p50_ms=${a.p50.toFixed(1)} floor_paced_p99_ms=${a.p99.toFixed(1)} floor_cpu_ms_per_1000=${a.total.toFixed(0)} mux_paced_p99_ms=${b.p99.toFixed(1)} mux_cpu_ms_per_1000=${b.total.toFixed(0)} raw_paced_p99_ms=${pct(rawPaced.latencies, 99).toFixed(1)} quiet=${load.quiet ? "yes" : "no"}`,
  );
} finally {
  raw.stop();
  await stack.stop();
}
