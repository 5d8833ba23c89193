// Exiting without hanging. Node 24's process.exit() can wait forever (nodejs/node#64274, #54918):
// the exit joins V8's worker threads, and a background Sparkplug or Maglev compile that ran out of
// room waits there for a garbage collection that only the main thread, now exiting, could run.
// Seen here in a test file's forced exit: all tests passed, then the process sat in
// NodePlatform::Shutdown until CI's 90 minutes ran out; under load it took 1 exit in 10.
// TurboFan compiles in the background without allocating on the heap, and stays on.
import { setFlagsFromString } from "node:v8";

/** The V8 flags that keep every compile that allocates on the heap on the main thread. */
const HEAP_SAFE_EXIT_FLAGS: readonly string[] = ["--no-concurrent-sparkplug", "--no-maglev"];

/** How long compiles already running get to finish, and a collection one asked for to run. */
const SETTLE_MS = 100;

/** Starts no more background compiles that allocate on the heap; V8 reads both flags per compile. */
export function keepHeapCompilesOnMainThread(): void {
  for (const flag of HEAP_SAFE_EXIT_FLAGS) setFlagsFromString(flag);
}

/**
 * process.exit(code), after turning those compiles off and letting the ones in flight end, for a
 * process that ran with them on (a service's optimizing tiers pay for themselves while it serves).
 */
export async function exitProcess(code: number): Promise<never> {
  keepHeapCompilesOnMainThread();
  await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
  process.exit(code);
}
