// The raw grpc-js baseline of bench/stream and bench/stream-floor, driven from the benchmark's
// process: a bare server (raw-grpc-server.ts) in its own process, four client connections.
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { cpuMs } from "./cpu.js";

const now = () => performance.timeOrigin + performance.now();
const identity = (b: Buffer) => b;

/** Starts `script` (a file beside this one) with `args`; resolves with it and the port it prints first. */
export async function startPortPrinter(
  script: string,
  args: string[] = [],
): Promise<{ proc: ChildProcess; port: number }> {
  const proc = spawn(process.execPath, [fileURLToPath(new URL(script, import.meta.url)), ...args], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const [line] = (await once(proc.stdout!, "data")) as [Buffer];
  const port = Number(line.toString().trim());
  if (!Number.isInteger(port) || port <= 0) throw new Error(`${script} printed ${line} for its port`);
  return { proc, port };
}

export interface PacedFigures {
  latencies: number[];
  tokensPerS: number;
  /** The server's CPU per 1,000 messages, ms. */
  cpuPer1000: number;
}

/** The raw baseline; `run(n)` streams n messages on each of `streams` streams, as fast as it can. */
export async function startRaw(streams: number) {
  const { proc: server, port } = await startPortPrinter("./raw-grpc-server.js");
  const address = `127.0.0.1:${port}`;
  const clients = Array.from({ length: 4 }, () => new grpc.Client(address, grpc.credentials.createInsecure()));
  const run = async (n: number) => {
    let received = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from(
        { length: streams },
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
    if (received !== streams * n) throw new Error(`raw: expected ${streams * n} messages, received ${received}`);
    return received / ((performance.now() - t0) / 1000);
  };
  /** n streams, each `count` messages at `rate` a second; delays from write to receipt, and the server's CPU. */
  const paced = async (n: number, count: number, rate: number): Promise<PacedFigures> => {
    const latencies: number[] = [];
    const cpu0 = cpuMs([server.pid!]);
    const t0 = performance.now();
    await Promise.all(
      Array.from(
        { length: n },
        (_, i) =>
          new Promise<void>((resolve, reject) => {
            const call = clients[i % clients.length].makeBidiStreamRequest("/bench.Raw/Stream", identity, identity);
            call.on("data", (b: Buffer) => latencies.push(now() - b.readDoubleBE(0)));
            call.on("end", () => resolve());
            call.on("error", reject);
            const req = Buffer.alloc(8);
            req.writeUInt32BE(count, 0);
            req.writeUInt32BE(rate, 4);
            call.write(req);
            call.end();
          }),
      ),
    );
    if (latencies.length !== n * count)
      throw new Error(`raw paced: expected ${n * count}, received ${latencies.length}`);
    const seconds = (performance.now() - t0) / 1000;
    return {
      latencies,
      tokensPerS: latencies.length / seconds,
      cpuPer1000: ((cpuMs([server.pid!]) - cpu0) / latencies.length) * 1000,
    };
  };
  return {
    pid: server.pid!,
    run,
    paced,
    stop() {
      for (const c of clients) c.close();
      server.kill("SIGTERM");
    },
  };
}

/**
 * `n` raw grpc-js round trips to a bare server in another process, one after another, each a new
 * bidi call carrying one request and `replies` replies: ms each, to the first reply (the floor of
 * one hop of a request that must be answered: bench/abort, bench/approvals) or, `untilEnd`, to the
 * call's status after the last (a whole call: bench/sandbox's exec, a started message and an exit).
 */
export async function rawRoundTrips(n: number, { replies = 1, untilEnd = false } = {}): Promise<number[]> {
  const { proc: server, port } = await startPortPrinter("./raw-grpc-server.js");
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  try {
    const times: number[] = [];
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      await new Promise<void>((resolve, reject) => {
        const call = client.makeBidiStreamRequest("/bench.Raw/Stream", identity, identity);
        let got = 0;
        call.on("data", () => {
          if (++got === 1 && !untilEnd) resolve();
        });
        call.on("status", (s: grpc.StatusObject) =>
          s.code === grpc.status.OK && got === replies ? resolve() : reject(new Error(`raw: ${s.details}`)),
        );
        call.on("error", reject);
        const req = Buffer.alloc(4);
        req.writeUInt32BE(replies);
        call.write(req);
        call.end();
      });
      times.push(performance.now() - t0);
    }
    return times;
  } finally {
    client.close();
    server.kill("SIGTERM");
  }
}
