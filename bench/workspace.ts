// bench/workspace: what keeping workspaces past their containers costs (sandbox/workspaces/workspace-saves.ts),
// against the docker CLI in the same run.
//   first command of a session: a warm-pool claim (no save), a resume (the session's container
//     gone, its save unpacked into a claimed one), and a cold start (no pool: create, start,
//     greet) — p50 and p99 of `true` through the service;
//   a 100 MB workspace (100 files of 1 MiB of random bytes): the service's save and restore
//     (tar inside the sandbox, streamed over the agent's channel; from its debug log) against
//     `docker exec tar -c` into a file and `docker exec -i tar -x` from it, on the same files;
//     and a snapshot of it (CreateSnapshot, the call's wall time) and its restore into another
//     session (the unpack at that session's first command, from the debug log), against the same.
//
//   node dist/bench/workspace.js [--runtime runc|runsc] [--n 10]
import { execFile, spawn } from "node:child_process";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs, promisify } from "node:util";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import type { ServiceClient } from "../services/shared/rpc.js";
import { exec, savedAfter, sessionContainer } from "../test/helpers/sandbox.js";
import { LOAD_QUOTAS, startStack, waitFor } from "../test/helpers/stack.js";
import { pct } from "./support/stats.js";

const run = promisify(execFile);
const { values } = parseArgs({
  options: { runtime: { type: "string", default: "runc" }, n: { type: "string", default: "10" } },
});
const N = Number(values.n);
type Sandbox = ServiceClient<(typeof SandboxService)["method"]>;
const env = { ...LOAD_QUOTAS, TROUPE_SANDBOX_RUNTIME: values.runtime!, TROUPE_LOG_LEVEL: "debug" };
const fmt = (xs: number[]) => `p50=${pct(xs, 50).toFixed(1)} ms p99=${pct(xs, 99).toFixed(1)} ms (n=${xs.length})`;

async function first(sandbox: Sandbox, id: string): Promise<number> {
  const t0 = performance.now();
  const r = await exec(sandbox, id, "true");
  if (r.exit.exitCode !== 0) throw new Error(`true exited ${r.exit.exitCode}`);
  return performance.now() - t0;
}
const gone = async (name: string) => {
  await run("docker", ["rm", "-f", name]).catch(() => undefined);
  await waitFor(
    `${name} removed`,
    () =>
      run("docker", ["inspect", name]).then(
        () => false,
        () => true,
      ),
    10_000,
    50,
  );
};
/** Lets the warm pool refill between samples, so each claim finds one. */
const settle = () => new Promise((r) => setTimeout(r, 1500));

const stack = await startStack({ services: ["sandbox"], env });
const sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
const claim: number[] = [];
const resume: number[] = [];
const cold: number[] = [];
let save = 0;
let restore = 0;
let cliSave = 0;
let cliRestore = 0;
let snapshot = 0;
let snapshotRestore = 0;
const logged = (what: string, id: string) => {
  const line = stack
    .logs()
    .split("\n")
    .reverse()
    .find((l) => l.includes(what) && l.includes(`.${id}"`));
  return Number(/"ms":(\d+)/.exec(line ?? "")?.[1] ?? Number.NaN);
};
try {
  await first(sandbox, "warmup");
  for (let i = 0; i < N; i++) {
    await settle();
    claim.push(await first(sandbox, `claim-${i}`));
  }
  // A small workspace (what sessions mostly have): 20 files, 200 KB.
  for (let i = 0; i < N; i++) {
    const id = `resume-${i}`;
    const since = Date.now();
    await exec(sandbox, id, "for i in $(seq 20); do head -c 10240 /dev/urandom > f$i; done");
    await savedAfter(stack.dataDir, id, since);
    await gone(sessionContainer(stack.dataDir, id));
    await settle();
    resume.push(await first(sandbox, id));
  }

  // 100 MB: the service's save and restore, and the CLI's tar of the same files.
  const id = "big";
  const since = Date.now();
  const made = await exec(
    sandbox,
    id,
    "for i in $(seq 100); do head -c 1048576 /dev/urandom > f$i; done; du -sm . | cut -f1",
    {
      timeoutMs: 120_000,
    },
  );
  if (Number(made.out.trim()) < 100) throw new Error(`the workspace holds ${made.out.trim()} MB`);
  await savedAfter(stack.dataDir, id, since);
  save = logged("saved a workspace", id);
  const name = sessionContainer(stack.dataDir, id);
  const dir = await mkdtemp(path.join(os.tmpdir(), "bench-workspace-"));
  const file = path.join(dir, "cli.tar");
  let t0 = performance.now();
  await new Promise<void>((resolve, reject) => {
    const p = spawn("docker", ["exec", "-u", "65534", "-w", "/workspace", name, "tar", "-cf", "-", "."]);
    p.stdout.pipe(createWriteStream(file));
    p.once("error", reject);
    p.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`docker exec tar -c: ${code}`))));
  });
  cliSave = performance.now() - t0;
  await gone(name);
  await settle();
  await first(sandbox, id);
  restore = logged("restored a workspace", id);
  const check = await exec(sandbox, id, "du -sm . | cut -f1; rm -rf ./*");
  if (Number(check.out.trim()) < 100) throw new Error(`restored ${check.out.trim()} MB`);
  t0 = performance.now();
  await new Promise<void>((resolve, reject) => {
    const p = spawn("docker", ["exec", "-i", "-u", "65534", "-w", "/workspace", name, "tar", "-xf", "-"]);
    let stderr = "";
    p.stderr.on("data", (d) => (stderr += d));
    p.stdin.on("error", () => undefined);
    createReadStream(file).pipe(p.stdin);
    p.once("error", reject);
    p.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`docker exec tar -x: ${code} ${stderr}`))));
  });
  cliRestore = performance.now() - t0;
  await rm(dir, { recursive: true, force: true });
  // The same 100 MB as a snapshot, and that snapshot restored into another session.
  t0 = performance.now();
  const { snapshot: made100 } = await sandbox.createSnapshot({ sessionId: id, name: "bench" }, { timeoutMs: 180_000 });
  snapshot = performance.now() - t0;
  await sandbox.restoreSnapshot({ snapshotId: made100!.snapshotId, sessionId: "big-copy" });
  await first(sandbox, "big-copy");
  snapshotRestore = logged("restored a workspace", "big-copy");
  const copied = await exec(sandbox, "big-copy", "du -sm . | cut -f1");
  if (Number(copied.out.trim()) < 100) throw new Error(`the snapshot restored ${copied.out.trim()} MB`);
  await sandbox.deleteSnapshot({ snapshotId: made100!.snapshotId });
} finally {
  sandbox.close();
  await stack.stop();
}

// Cold: no pool, so a new session's first command makes its container.
const coldStack = await startStack({ services: ["sandbox"], env: { ...env, TROUPE_SANDBOX_POOL: "0" } });
const coldClient = coldStack.client(SandboxService, coldStack.addr.sandbox, { as: DEV_IDENTITY });
try {
  await first(coldClient, "warmup");
  for (let i = 0; i < N; i++) cold.push(await first(coldClient, `cold-${i}`));
} finally {
  coldClient.close();
  await coldStack.stop();
}

console.log(`first command, warm-pool claim: ${fmt(claim)}`);
console.log(`first command, resume from a save (200 KB): ${fmt(resume)}`);
console.log(`first command, cold start: ${fmt(cold)}`);
console.log(`100 MB save: ${save} ms (docker exec tar -c: ${cliSave.toFixed(0)} ms)`);
console.log(`100 MB restore: ${restore} ms (docker exec -i tar -x: ${cliRestore.toFixed(0)} ms)`);
console.log(`100 MB snapshot: ${snapshot.toFixed(0)} ms; its restore: ${snapshotRestore} ms`);
console.log(
  `RESULT runtime=${values.runtime} claim_p50_ms=${pct(claim, 50).toFixed(1)} resume_p50_ms=${pct(resume, 50).toFixed(1)} resume_p99_ms=${pct(resume, 99).toFixed(1)} cold_p50_ms=${pct(cold, 50).toFixed(1)} save_100mb_ms=${save} save_vs_cli_tar=${(save / cliSave).toFixed(2)} restore_100mb_ms=${restore} restore_vs_cli_tar=${(restore / cliRestore).toFixed(2)} snapshot_100mb_ms=${snapshot.toFixed(0)} snapshot_vs_cli_tar=${(snapshot / cliSave).toFixed(2)} snapshot_restore_ms=${snapshotRestore} snapshot_restore_vs_cli_tar=${(snapshotRestore / cliRestore).toFixed(2)}`,
);
