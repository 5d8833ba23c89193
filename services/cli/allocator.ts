// The C allocator Troupe's services run on. Under steady load glibc's malloc keeps the
// native memory it was handed back (gRPC and HTTP/2 buffers, LanceDB's write path) in its arenas,
// and a service's RSS climbs for hours; jemalloc with a background purging thread returns it to the
// system. Measured by the long soak, same build, back to back (bench/history.md, The long soak).
//
// Node links glibc's malloc; jemalloc replaces it by LD_PRELOAD, which must be in the environment
// when a process starts: `troupe up`'s children get it in theirs, and a service started alone (as
// the Kubernetes manifests do) or `--one-process` executes itself again with it (and with the
// Node flags jit.ts gives the service, which `troupe up` passes its children itself).
import { existsSync } from "node:fs";
import { missingFlags } from "./jit.js";

/** Where Debian (each architecture), Fedora and a source build put the library. */
const LIBRARY_PATHS = [
  "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
  "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
  "/usr/lib64/libjemalloc.so.2",
  "/usr/local/lib/libjemalloc.so.2",
];

/**
 * Freed pages go back to the system after a second, by jemalloc's own thread, so an idle service
 * shrinks without an allocation to trigger the purge. An operator's MALLOC_CONF wins.
 */
export const JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";

export type AllocatorChoice = "auto" | "jemalloc" | "system";

/**
 * `env` with jemalloc preloaded when `choice` asks for it and it is installed (auto), or always
 * (jemalloc: a missing library is an error). Unchanged for system, or when LD_PRELOAD already
 * names a jemalloc.
 */
export function allocatorEnvironment(
  choice: AllocatorChoice,
  env: NodeJS.ProcessEnv,
  exists: (file: string) => boolean = existsSync,
): NodeJS.ProcessEnv {
  if (choice === "system" || hasJemalloc(env)) return env;
  const library = LIBRARY_PATHS.find(exists);
  if (!library) {
    if (choice === "auto") return env;
    throw new Error(
      `TROUPE_ALLOCATOR=jemalloc, but libjemalloc.so.2 is in none of ${LIBRARY_PATHS.join(", ")} (Debian: apt-get install libjemalloc2)`,
    );
  }
  return {
    ...env,
    LD_PRELOAD: env.LD_PRELOAD ? `${env.LD_PRELOAD} ${library}` : library,
    MALLOC_CONF: env.MALLOC_CONF || JEMALLOC_CONF,
  };
}

/** Whether a process started with `env` preloads jemalloc. */
export const hasJemalloc = (env: NodeJS.ProcessEnv): boolean => /libjemalloc/.test(env.LD_PRELOAD ?? "");

/**
 * Executes this process again, same pid and descriptors, with the allocator `choice` asks for and
 * the Node flags `nodeFlags` (jit.ts), if it lacks either (otherwise returns). Call before anything
 * is started.
 */
export function startOver(choice: AllocatorChoice, env: NodeJS.ProcessEnv, nodeFlags: string[] = []): void {
  const wanted = allocatorEnvironment(choice, env);
  const flags = missingFlags(nodeFlags, process.execArgv);
  if ((wanted === env && flags.length === 0) || !process.execve) return;
  process.execve(process.execPath, [process.execPath, ...flags, ...process.execArgv, ...process.argv.slice(1)], wanted);
}
