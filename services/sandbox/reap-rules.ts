// Why the reaper removes a container of this instance, or undefined to keep it: stopped; pooled by
// an earlier process; past its maximum age; or, when no command runs in it, made under settings
// this service no longer makes, or unused for the idle time. A pooled container is never idle.
// A container this process holds (in its pool, or claimed) is never a leftover, even when the
// listing that named it pooled predates its claim's rename.
export interface ReapFacts {
  running: boolean;
  /** Pooled, by its name, and not held by this process. */
  leftInPool: boolean;
  /** Milliseconds since it was made. */
  age: number;
  /** Milliseconds since its last use (0 for a pooled one). */
  idle: number;
  /** A command runs in it. */
  busy: boolean;
  /** Its settings are ones this service makes (its image's config hash). */
  knownSettings: boolean;
  limits: { maxAgeMs: number; idleMs: number };
}

export function reapReason(f: ReapFacts): string | undefined {
  if (!f.running) return "stopped";
  if (f.leftInPool) return "a pooled sandbox this process did not make";
  if (f.age > f.limits.maxAgeMs) return "past its maximum age";
  if (f.busy) return undefined;
  if (!f.knownSettings) return "made under other settings";
  if (f.idle > f.limits.idleMs) return "idle";
  return undefined;
}
