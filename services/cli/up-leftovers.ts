// What a `troupe up` leaves when it is killed without a chance to stop its services (SIGKILL, a
// crash, the machine's OOM killer): service processes still running, and sandbox containers.
// The next start on the same data directory ends those processes and removes those containers
// before it starts its own; a clean stop removes the containers too. A second `troupe up` on a
// data directory whose supervisor still runs is refused: two stacks would share one store.
import { readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { instanceOf } from "../sandbox/container-spec.js";
import type { Logger } from "../shared/log.js";

interface UpFile {
  supervisor: number;
  services: { service: string; pid: number | null }[];
}

/** The command line of a live process, or undefined when there is none. */
async function commandLine(pid: number): Promise<string | undefined> {
  const raw = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => undefined);
  return raw?.split("\0").join(" ");
}

/** A pid recorded in up.json that still runs Troupe's entry point (not a pid the kernel reused). */
async function stillTroupe(pid: number, main: string): Promise<boolean> {
  return (await commandLine(pid))?.includes(main) ?? false;
}

/**
 * Refuses to start over a running supervisor; ends the services an earlier, killed one left, and
 * removes its containers. Returns what it ended, for the log.
 */
export async function reapLeftovers(upFile: string, dataDir: string, main: string, logger: Logger): Promise<void> {
  const text = await readFile(upFile, "utf8").catch(() => undefined);
  if (text) {
    const up = JSON.parse(text) as UpFile;
    if (up.supervisor !== process.pid && (await stillTroupe(up.supervisor, main)))
      throw new Error(`troupe up already runs on ${dataDir} (pid ${up.supervisor}); stop it first`);
    const orphans = up.services.filter((s) => s.pid !== null && s.pid !== up.supervisor);
    const alive: { service: string; pid: number }[] = [];
    for (const s of orphans) if (await stillTroupe(s.pid!, main)) alive.push({ service: s.service, pid: s.pid! });
    for (const s of alive) process.kill(s.pid, "SIGTERM");
    // A draining service gets a few seconds; one that is stopped or stuck is killed.
    for (let waited = 0; waited < 10_000 && (await anyAlive(alive, main)); waited += 200) await sleep(200);
    for (const s of alive) if (await stillTroupe(s.pid, main)) process.kill(s.pid, "SIGKILL");
    if (alive.length > 0)
      logger.warn(
        `an earlier troupe up (pid ${up.supervisor}) was killed and left ${alive.map((s) => `${s.service} (pid ${s.pid})`).join(", ")} running: ended them`,
      );
  }
  const removed = await removeSandboxes(dataDir);
  if (removed > 0) logger.warn(`removed ${removed} sandbox container(s) an earlier run of this data directory left`);
}

async function anyAlive(procs: { pid: number }[], main: string): Promise<boolean> {
  for (const p of procs) if (await stillTroupe(p.pid, main)) return true;
  return false;
}

/**
 * Removes every sandbox container made for this data directory. Without a Docker engine there
 * is nothing to remove: 0.
 */
export async function removeSandboxes(dataDir: string): Promise<number> {
  const { default: Docker } = await import("dockerode");
  const docker = new Docker();
  const listed = await docker
    .listContainers({ all: true, filters: { label: [`troupe.instance=${instanceOf(dataDir)}`] } })
    .catch(() => []);
  await Promise.all(
    listed.map((c) =>
      docker
        .getContainer(c.Id)
        .remove({ force: true })
        .catch(() => undefined),
    ),
  );
  return listed.length;
}
