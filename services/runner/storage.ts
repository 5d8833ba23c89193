// Everything a runner keeps, behind one interface: session logs with their leases and epochs,
// schedules, owners' profiles, and the runner's membership among the runners sharing the storage
// (its heartbeat: while it beats, the others treat its sessions as live). The server is given a
// RunnerStorage and nothing else about where state lives, so a second implementation (a
// networked database) is added here without touching the actor, the loop or the server.
import path from "node:path";
import { InMemoryScheduleStore, InMemorySessionStore } from "./in-memory-store.js";
import { FileProfileStore, InMemoryProfileStore, type ProfileStore } from "./profile-store.js";
import { FileScheduleStore, type ScheduleStore } from "./schedule-files.js";
import type { Owner } from "./session-lease.js";
import { JsonlSessionStore, type SessionStore } from "./session-log.js";

export interface RunnerStorage {
  readonly sessions: SessionStore;
  readonly schedules: ScheduleStore;
  readonly profiles: ProfileStore;
  /** Joins the runners sharing this storage (and brings older layouts up to date). Call before serving. */
  start(): Promise<void>;
  /** Leaves them; call after every session log is closed. */
  stop(): Promise<void>;
}

/**
 * The file store in a data directory (sessions/, runners/, schedules/, profiles/). Runners that
 * share the directory arbitrate sessions through it (session-lease.ts).
 */
export function fileStorage(
  dataDir: string,
  self: Owner,
  livenessMs: number,
  /** Called for a schedule file that cannot be read (it is skipped). Contract: never throws. */
  damagedSchedule: (file: string) => void,
): RunnerStorage {
  const sessions = new JsonlSessionStore(dataDir, self, livenessMs);
  const schedules = new FileScheduleStore(path.join(dataDir, "schedules"), damagedSchedule);
  return {
    sessions,
    schedules,
    profiles: new FileProfileStore(path.join(dataDir, "profiles")),
    async start() {
      await sessions.start();
      await schedules.migrate();
    },
    stop: () => sessions.stop(),
  };
}

/** Everything in this process: the in-process tests' storage (no durability, the same contracts). */
export function inMemoryStorage(): RunnerStorage & {
  sessions: InMemorySessionStore;
  schedules: InMemoryScheduleStore;
  profiles: InMemoryProfileStore;
} {
  return {
    sessions: new InMemorySessionStore(),
    schedules: new InMemoryScheduleStore(),
    profiles: new InMemoryProfileStore(),
    start: async () => undefined,
    stop: async () => undefined,
  };
}
