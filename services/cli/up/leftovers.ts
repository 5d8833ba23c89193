// What a `troupe up` leaves when it is killed without a chance to stop its services (SIGKILL, a
// crash, the machine's OOM killer): service processes still running, and sandbox containers.
// The next start on the same data directory ends those processes and removes those containers
// before it starts its own; a clean stop removes the containers too. A second `troupe up` on a
// data directory whose supervisor still runs is refused: two stacks would share one store.
import { readFile, readlink, realpath } from "node:fs/promises";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { instanceOf } from "../../sandbox/container-spec.js";
import type { Logger } from "../../shared/process/log.js";
import { Engine, engineAddress, type EngineSettings } from "../../sandbox/engine.js";
import type { UpFile } from "./file.js";

/**
 * A pid recorded in up.json that still runs `troupe <command>` (not a pid the kernel gave to
 * another process since, such as a `troupe chat`). `main`: the entry point's real path.
 */
async function stillTroupe(pid: number, main: string, command: string): Promise<boolean> {
  const args = (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).split("\0");
  const cwd = await readlink(`/proc/${pid}/cwd`).catch(() => undefined);
  if (cwd === undefined) return false;
  // However it was started (a relative path, npx's link in node_modules/.bin): the same file.
  for (let i = 1; i < Math.min(args.length - 1, 8); i++) {
    const file = await realpath(path.resolve(cwd, args[i])).catch(() => "");
    if (file === main) return args[i + 1] === command;
  }
  return false;
}

/** The command a service of up.json runs as: its name without an instance number. */
const commandOf = (service: string) => service.replace(/-\d+$/, "");

/**
 * Refuses to start over a running supervisor; ends the services an earlier, killed one left, and
 * removes the data directory's containers.
 */
export async function reapLeftovers(
  upFile: string,
  dataDir: string,
  engine: EngineSettings,
  entry: string,
  logger: Logger,
): Promise<void> {
  const text = await readFile(upFile, "utf8").catch(() => undefined);
  if (text) {
    const main = await realpath(entry).catch(() => entry);
    const up = JSON.parse(text) as UpFile;
    if (up.supervisor !== process.pid && (await stillTroupe(up.supervisor, main, "up")))
      throw new Error(`troupe up already runs on ${dataDir} (pid ${up.supervisor}); stop it first`);
    const orphans = up.services.filter((s) => s.pid !== null && s.pid !== up.supervisor);
    const alive: { service: string; pid: number }[] = [];
    for (const s of orphans)
      if (await stillTroupe(s.pid!, main, commandOf(s.service))) alive.push({ service: s.service, pid: s.pid! });
    for (const s of alive) process.kill(s.pid, "SIGTERM");
    // A draining service gets a few seconds; one that is stopped or stuck is killed.
    for (let waited = 0; waited < 10_000 && (await anyAlive(alive, main)); waited += 200) await sleep(200);
    for (const s of alive) if (await stillTroupe(s.pid, main, commandOf(s.service))) process.kill(s.pid, "SIGKILL");
    if (alive.length > 0)
      logger.warn(
        `an earlier troupe up (pid ${up.supervisor}) was killed and left ${alive.map((s) => `${s.service} (pid ${s.pid})`).join(", ")} running: ended them`,
      );
  }
  const removed = await removeSandboxes(dataDir, engine);
  if (removed > 0) logger.warn(`removed ${removed} sandbox container(s) an earlier run of this data directory left`);
}

async function anyAlive(procs: { service: string; pid: number }[], main: string): Promise<boolean> {
  for (const p of procs) if (await stillTroupe(p.pid, main, commandOf(p.service))) return true;
  return false;
}

/**
 * Removes every sandbox container made for this data directory. Without a Docker engine there
 * is nothing to remove: 0.
 */
export async function removeSandboxes(dataDir: string, engine: EngineSettings): Promise<number> {
  let docker: Engine;
  try {
    docker = new Engine(engineAddress(engine));
  } catch {
    return 0; // a DOCKER_HOST Troupe cannot reach: the sandbox service says so at its start
  }
  try {
    const listed = await docker
      .listContainers({ all: true, filters: { label: [`troupe.instance=${instanceOf(dataDir)}`] } })
      .catch(() => []);
    await Promise.all(
      listed.map((c) =>
        docker
          .getContainer(c.Id)
          .remove()
          .catch(() => undefined),
      ),
    );
    return listed.length;
  } finally {
    docker.close();
  }
}
