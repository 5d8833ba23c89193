// Whether the machine was quiet while a benchmark measured, so that its figures can say so (issue
// 26: "on a quiet machine; say when it is not"). /proc/stat accounts for every CPU of the machine;
// less the CPU of the processes the benchmark runs, what is left is everyone else's work. Steal is
// time the hypervisor gave these cores to another guest: no process here sees it, and on a shared
// VM it is what makes two runs of the same build differ.
import { readFileSync } from "node:fs";

const TICK_MS = 10;
/** Above these the machine was not quiet: other work worth a tenth of a core, or 2 % stolen. */
const OTHERS_LIMIT_PCT_OF_CORE = 10;
const STEAL_LIMIT_PCT = 2;

interface Account {
  /** user + nice + system over all CPUs, ms: what processes ran (interrupts apart). */
  processMs: number;
  /** irq + softirq, ms: mostly the loopback network the benchmark itself drives. */
  interruptMs: number;
  stealMs: number;
  /** Every column, ms: the cores' whole time. */
  totalMs: number;
  cores: number;
}

function account(): Account {
  const stat = readFileSync("/proc/stat", "utf8");
  const [all, ...rest] = stat.split("\n");
  // cpu user nice system idle iowait irq softirq steal guest guest_nice (guests are inside user)
  const [user, nice, system, idle, iowait, irq, softirq, steal] = all.trim().split(/\s+/).slice(1, 9).map(Number);
  return {
    processMs: (user + nice + system) * TICK_MS,
    interruptMs: (irq + softirq) * TICK_MS,
    stealMs: steal * TICK_MS,
    totalMs: (user + nice + system + idle + iowait + irq + softirq + steal) * TICK_MS,
    cores: rest.filter((l) => /^cpu\d+ /.test(l)).length,
  };
}

/** The CPU's model and clock as the kernel names them: runs on two machines differ by these too. */
function cpuName(): string {
  const info = readFileSync("/proc/cpuinfo", "utf8");
  const model = /^model name\s*:\s*(.+)$/m.exec(info)?.[1]?.trim() ?? "unknown CPU";
  const mhz = /^cpu MHz\s*:\s*([\d.]+)$/m.exec(info)?.[1];
  return mhz ? `${model}, ${Math.round(Number(mhz))} MHz` : model;
}

export interface MachineLoad {
  cores: number;
  cpu: string;
  /** Other processes' CPU, as a share of one core (100 = a whole core's worth). */
  othersPctOfCore: number;
  /** Interrupt handling, as a share of one core (not judged: the benchmark's own traffic causes it). */
  interruptsPctOfCore: number;
  /** Time stolen by the hypervisor, as a share of the machine's time. */
  stealPct: number;
  quiet: boolean;
}

/**
 * Starts watching; `end()` says how busy the rest of the machine was since. `ownCpuMs` is the
 * benchmark's processes' CPU so far (itself included), read at the start and at the end.
 */
export function watchMachine(ownCpuMs: () => number): { end(): MachineLoad } {
  const before = account();
  const ownBefore = ownCpuMs();
  const t0 = performance.now();
  return {
    end() {
      const after = account();
      const wallMs = performance.now() - t0;
      const own = ownCpuMs() - ownBefore;
      const pctOfCore = (ms: number) => Math.max(0, (ms / wallMs) * 100);
      const othersPctOfCore = pctOfCore(after.processMs - before.processMs - own);
      const stealPct = Math.max(0, ((after.stealMs - before.stealMs) / (after.totalMs - before.totalMs || 1)) * 100);
      return {
        cores: after.cores,
        cpu: cpuName(),
        othersPctOfCore,
        interruptsPctOfCore: pctOfCore(after.interruptMs - before.interruptMs),
        stealPct,
        quiet: othersPctOfCore <= OTHERS_LIMIT_PCT_OF_CORE && stealPct <= STEAL_LIMIT_PCT,
      };
    },
  };
}

export const describeLoad = (phase: string, m: MachineLoad): string =>
  `machine during ${phase}: ${m.cores} cores (${m.cpu}); other processes ${m.othersPctOfCore.toFixed(0)} % of a core, ` +
  `interrupts ${m.interruptsPctOfCore.toFixed(0)} %, stolen by the hypervisor ${m.stealPct.toFixed(1)} % ` +
  `(${m.quiet ? "quiet" : `NOT quiet: over ${OTHERS_LIMIT_PCT_OF_CORE} % of a core or ${STEAL_LIMIT_PCT} % stolen`})`;
