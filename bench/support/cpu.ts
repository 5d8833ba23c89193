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
