// Idle resident memory of each service after start and one tool turn, as `troupe up` runs them
// (one process per service, or all in one with --one-process). Baseline, same run: a bare Node
// process serving one gRPC health service over grpc-js, the floor any service of ours stands on.
//
//   node dist/bench/footprint.js [--settle-ms 10000] [--mode both|processes|one-process]
//
// RESULT bare_grpc_mb=... gateway_mb=... router_mb=... sandbox_mb=... runner_mb=... memory_mb=...
//        footprint_total_mb=... pss_total_mb=... one_process_mb=...
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { freePort } from "../services/cli/free-port.js";

const MAIN = fileURLToPath(new URL("../services/cli/main.js", import.meta.url));
const BARE = fileURLToPath(new URL("./support/bare-grpc-server.js", import.meta.url));
/** The issue's budgets (MB): gateway, router and sandbox 70, runner 90, memory 150; one process 200. */
const BUDGET: Record<string, number> = { gateway: 70, router: 70, sandbox: 70, runner: 90, memory: 150 };
const ONE_PROCESS_BUDGET = 200;

const { values } = parseArgs({
  options: { "settle-ms": { type: "string", default: "10000" }, mode: { type: "string", default: "both" } },
});
const settleMs = Number(values["settle-ms"]);

const mb = (kb: number) => Math.round((kb / 1024) * 10) / 10;

/**
 * Resident set size of a process, in MB (VmRSS), with its anonymous and file-backed parts, and
 * its proportional share (PSS: pages shared with other processes, such as the node binary's code
 * that every service maps, are divided among them).
 */
export async function rss(pid: number): Promise<{ total: number; anon: number; file: number; pss: number }> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const rollup = await readFile(`/proc/${pid}/smaps_rollup`, "utf8");
  const kb = (text: string, field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(text)?.[1]);
  return {
    total: mb(kb(status, "VmRSS")),
    anon: mb(kb(status, "RssAnon")),
    file: mb(kb(status, "RssFile") + kb(status, "RssShmem")),
    pss: mb(kb(rollup, "Pss")),
  };
}

interface Up {
  proc: ChildProcess;
  dataDir: string;
  gateway: string;
  pids: Record<string, number>;
}

async function startUp(extra: string[]): Promise<Up> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-footprint-"));
  const addr = async () => `127.0.0.1:${await freePort()}`;
  const gateway = await addr();
  const flags = ["--data-dir", dataDir, "--gateway", gateway, "--router", await addr(), "--runner", await addr()];
  flags.push("--memory", await addr(), "--sandbox", await addr(), "--model-server", await addr(), "--http", "off");
  const proc = spawn(process.execPath, [MAIN, "up", ...flags, ...extra], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, TROUPE_LOG_FORMAT: "text", TROUPE_METRICS_ADDR: "" },
  });
  let out = "";
  proc.stdout!.on("data", (d) => (out += d));
  proc.stderr!.on("data", (d) => (out += d));
  const deadline = Date.now() + 90_000;
  while (!out.includes("Troupe is up")) {
    if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`troupe up did not start:\n${out}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const up = JSON.parse(await readFile(path.join(dataDir, "up.json"), "utf8")) as {
    supervisor: number;
    services: { service: string; pid: number | null }[];
  };
  const pids: Record<string, number> = {};
  for (const s of up.services) if (s.pid) pids[s.service] = s.pid;
  return { proc, dataDir, gateway, pids };
}

async function oneToolTurn(up: Up): Promise<void> {
  const chat = spawn(process.execPath, [MAIN, "chat", "--data-dir", up.dataDir, "--gateway", up.gateway, "$ echo hi"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  chat.stdout!.on("data", (d) => (out += d));
  chat.stderr!.on("data", (d) => (out += d));
  const [code] = await once(chat, "exit");
  if (code !== 0 || !out.includes("hi")) throw new Error(`the tool turn failed (${code}):\n${out}`);
}

async function stopUp(up: Up): Promise<void> {
  up.proc.kill("SIGTERM");
  await once(up.proc, "exit");
  await rm(up.dataDir, { recursive: true, force: true });
}

/** Each service's resident MB, and `pss`: the machine's real cost of them all together. */
async function measureUp(extra: string[]): Promise<Record<string, number>> {
  const up = await startUp(extra);
  try {
    await oneToolTurn(up);
    await new Promise((r) => setTimeout(r, settleMs));
    const figures: Record<string, number> = { pss: 0 };
    const counted = new Set<number>();
    for (const [name, pid] of Object.entries(up.pids)) {
      const r = await rss(pid);
      figures[name] = r.total;
      if (name !== "model-server" && !counted.has(pid)) figures.pss += r.pss;
      counted.add(pid);
      console.log(`  ${name}: ${r.total} MB resident (${r.anon} anonymous, ${r.file} mapped files; PSS ${r.pss})`);
    }
    figures.pss = Math.round(figures.pss * 10) / 10;
    return figures;
  } finally {
    await stopUp(up);
  }
}

async function bareGrpc(): Promise<number> {
  const proc = spawn(process.execPath, [BARE], { stdio: ["ignore", "pipe", "inherit"] });
  const [line] = (await once(proc.stdout!, "data")) as [Buffer];
  if (!String(line).startsWith("listening")) throw new Error(`bare server: ${line}`);
  await new Promise((r) => setTimeout(r, settleMs / 2));
  const r = await rss(proc.pid!);
  proc.kill();
  return r.total;
}

const bare = await bareGrpc();
console.log(`baseline: a bare grpc-js server process: ${bare} MB`);
const result: Record<string, number> = { bare_grpc_mb: bare };
let failed = false;
if (values.mode !== "one-process") {
  const each = await measureUp([]);
  let total = 0;
  for (const [name, budget] of Object.entries(BUDGET)) {
    const mb = each[name];
    total += mb;
    result[`${name}_mb`] = mb;
    const over = mb > budget;
    failed ||= over;
    console.log(`${name.padEnd(8)} ${String(mb).padStart(6)} MB  budget ${budget}${over ? "  OVER" : ""}`);
  }
  if (each["model-server"]) console.log(`(scripted model server: ${each["model-server"]} MB, not counted)`);
  result.footprint_total_mb = Math.round(total * 10) / 10;
  result.pss_total_mb = each.pss;
  console.log(
    `total    ${result.footprint_total_mb} MB resident; ${each.pss} MB proportional (PSS, shared pages split)`,
  );
}
if (values.mode !== "processes") {
  const one = await measureUp(["--one-process"]);
  const mb = one.gateway;
  result.one_process_mb = mb;
  console.log(`(one process, scripted model server included: it runs in the process too)`);
  const over = !(mb <= ONE_PROCESS_BUDGET);
  failed ||= over;
  console.log(`one process: ${mb} MB  budget ${ONE_PROCESS_BUDGET}${over ? "  OVER" : ""}`);
}
console.log(
  `RESULT ${Object.entries(result)
    .map(([k, v]) => `${k}=${v}`)
    .join(" ")}`,
);
if (failed) console.log("over budget: see above");
