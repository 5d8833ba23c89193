// <data-dir>/up.json: what a `troupe up` runs now (service, address, pid), for operators, scripts
// and the next start (leftovers.ts). It is rewritten whenever a child starts, and children
// start concurrently; so writes go one at a time, each writing the state as it is when it runs,
// to a temporary file renamed over up.json. A reader sees a whole file, and the last start is
// never overwritten by an older picture of the stack.
import { rename, rm, writeFile } from "node:fs/promises";

export interface UpFile {
  supervisor: number;
  store?: { service: string; address: string; pid: number };
  /** pid null: the service is between a crash and its restart. */
  services: { service: string; address?: string; pid: number | null }[];
}

export interface UpFileWriter {
  /** Writes `state()` soon; resolves once a write that began after this call has finished. */
  write(): Promise<void>;
  /** Waits for the writes under way, then removes up.json; later writes do nothing. */
  remove(): Promise<void>;
}

export function upFileWriter(file: string, state: () => UpFile, onError: (err: Error) => void): UpFileWriter {
  let chain: Promise<void> = Promise.resolve();
  /** The write queued behind the one running: later calls share it, as it reads the newest state. */
  let queued: Promise<void> | undefined;
  let removed = false;
  const temp = `${file}.${process.pid}.tmp`;

  const writeNow = async () => {
    queued = undefined;
    if (removed) return;
    try {
      await writeFile(temp, `${JSON.stringify(state(), null, 2)}\n`);
      await rename(temp, file);
    } catch (err) {
      onError(err as Error);
    }
  };

  return {
    write() {
      if (!queued) {
        queued = chain.then(writeNow);
        chain = queued;
      }
      return queued;
    },
    async remove() {
      removed = true;
      await chain;
      await rm(file, { force: true });
      await rm(temp, { force: true });
    },
  };
}
