// CPU time of processes, from /proc/<pid>/stat (user + system, in clock ticks of 10 ms).
import { readFileSync } from "node:fs";

const TICK_MS = 10;

/** User plus system CPU time of these processes so far, in ms. */
export function cpuMs(pids: number[]): number {
  let ticks = 0;
  for (const pid of pids) {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command (which may hold spaces) start after its closing parenthesis.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks += Number(fields[11]) + Number(fields[12]);
  }
  return ticks * TICK_MS;
}

/**
 * Waits until these processes together use under `belowPct` of one core over `windowMs`, so that
 * what one side left running (a backlog of background work) is not charged to the next measured
 * side. Gives up after `timeoutMs` and says so on stderr.
 */
export async function waitQuiet(
  pids: number[],
  {
    belowPct = 5,
    windowMs = 300,
    timeoutMs = 30_000,
  }: { belowPct?: number; windowMs?: number; timeoutMs?: number } = {},
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const before = cpuMs(pids);
    await new Promise((resolve) => setTimeout(resolve, windowMs));
    if (((cpuMs(pids) - before) / windowMs) * 100 < belowPct) return;
  }
  console.error(`the measured processes were still busy after ${timeoutMs} ms; measuring anyway`);
}
