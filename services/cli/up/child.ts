// One service instance `troupe up` supervises, as its supervisor (command.ts) and the one-process
// mode (one-process.ts) both see it.
import type { ChildProcess } from "node:child_process";

export interface Child {
  /** The instance's name: the service, with -2, -3... for extra instances. */
  name: string;
  address: string;
  args: string[];
  proc?: ChildProcess;
  restarts: number;
  startedAt: number;
}
