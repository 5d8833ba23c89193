// Who may write a session's log. Runners that share a store (one data directory on a shared
// volume) must never both run the same session: the router's placement usually keeps them apart,
// but placement changes while a runner is still alive (it rejoins, its router lease lapses, the
// router restarts). The store itself is therefore the arbiter:
//
// - Each activation of a session takes the next *epoch* by creating `<log>.lease.<epoch>`
//   exclusively. The file names the owner (runner id, address, process incarnation).
// - An owner is alive while its runner's heartbeat file (`runners/<runner-id>.json`, refreshed
//   every livenessMs/4) names the same incarnation and is younger than livenessMs. A live owner's
//   session is refused to everyone else: a second activation is refused, not merged.
// - Taking over from a dead owner removes its lease file. The old owner, should it still be
//   running after all (paused, partitioned), checks its lease file after every synced write and
//   stops the moment it is gone; and readers ignore any record it appended after the new owner's
//   epoch record, so a stale owner's late writes are refused either way.
//
// This needs a filesystem with POSIX create-exclusive and unlink visibility across the runners
// (a local disk, or a shared volume with close-to-open consistency).
import { randomUUID } from "node:crypto";
import { statSync } from "node:fs";
import { mkdir, readFile, rename, stat, unlink, utimes, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { RpcError, SESSION_OWNER_KEY, Status } from "../../shared/errors.js";
import { createExclusive } from "../../shared/exclusive-file.js";
import { processAlive } from "../../shared/membership.js";

/** One runner process: `incarnation` tells a restarted runner from its killed predecessor. */
export interface Owner {
  runnerId: string;
  /** Where the gateway reaches this runner. */
  address: string;
  incarnation: string;
}

/**
 * `owner` is this runner, `self`, by id and address. Of another incarnation, it is an earlier
 * process of it and is gone: this process holds the address now.
 */
export const sameRunner = (owner: Pick<Owner, "runnerId" | "address">, self: Owner): boolean =>
  owner.runnerId === self.runnerId && owner.address === self.address;

export interface Lease {
  epoch: number;
  /** The lease file; the lease holds while it exists. */
  file: string;
}

/**
 * The session is live on another runner, or this runner has lost it. ABORTED, as gRPC says for a
 * concurrency conflict the caller resolves at a higher level: the gateway retries at the owner.
 */
export class SessionElsewhere extends RpcError {
  constructor(
    message: string,
    readonly ownerAddress?: string,
  ) {
    super(Status.ABORTED, message);
  }
  get trailers(): Record<string, string> {
    return this.ownerAddress ? { [SESSION_OWNER_KEY]: this.ownerAddress } : {};
  }
}

interface Heartbeat extends Owner {
  pid: number;
  host: string;
}

export class SessionLeases {
  private readonly runnersDir: string;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly sessionsDir: string,
    readonly self: Owner,
    /** An owner whose heartbeat is older than this is dead. */
    readonly livenessMs = 10_000,
  ) {
    this.runnersDir = path.join(path.dirname(sessionsDir), "runners");
  }

  private heartbeatFile(runnerId: string): string {
    return path.join(this.runnersDir, `${encodeURIComponent(runnerId)}.json`);
  }

  private leaseFile(base: string, epoch: number): string {
    return `${base}.lease.${epoch}`;
  }

  /**
   * Writes this runner's heartbeat and keeps it fresh. Refuses to start when another live
   * process on this host already uses the runner id: two runners with one id would each think
   * the other's sessions were their own.
   */
  async start(): Promise<void> {
    await mkdir(this.runnersDir, { recursive: true });
    await mkdir(this.sessionsDir, { recursive: true });
    const file = this.heartbeatFile(this.self.runnerId);
    const previous = await readJson<Heartbeat>(file);
    if (
      previous &&
      previous.incarnation !== this.self.incarnation &&
      previous.host === os.hostname() &&
      previous.pid !== process.pid &&
      processAlive(previous.pid)
    ) {
      const age = Date.now() - (await stat(file)).mtimeMs;
      if (age < this.livenessMs)
        throw new Error(
          `runner id ${this.self.runnerId} is in use by process ${previous.pid} on this host; give each runner its own --runner-id`,
        );
    }
    const beat: Heartbeat = { ...this.self, pid: process.pid, host: os.hostname() };
    const tmp = `${file}.${randomUUID()}.tmp`;
    await writeFile(tmp, JSON.stringify(beat));
    await rename(tmp, file);
    this.timer = setInterval(
      () => {
        const now = new Date();
        utimes(file, now, now).catch(() => undefined);
      },
      Math.max(20, Math.floor(this.livenessMs / 4)),
    );
    this.timer.unref();
  }

  /** Stops the heartbeat and says this runner is gone, so its sessions can move at once. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    const file = this.heartbeatFile(this.self.runnerId);
    const beat = await readJson<Heartbeat>(file);
    if (beat?.incarnation === this.self.incarnation) await unlink(file).catch(() => undefined);
  }

  /** Whether the process `owner` names still runs: this one, or a runner whose heartbeat is fresh and names it. */
  async alive(owner: Owner): Promise<boolean> {
    if (owner.incarnation === this.self.incarnation) return true; // this process is alive
    // An earlier incarnation of this runner at this address is gone: this process holds the
    // address now. Said before its heartbeat says so, a restarted runner would refuse (until the
    // old beat ages out) the sessions it held a moment ago, which is what the gateway retries at.
    if (sameRunner(owner, this.self)) return false;
    const file = this.heartbeatFile(owner.runnerId);
    const [beat, st] = await Promise.all([readJson<Heartbeat>(file), stat(file).catch(() => undefined)]);
    return beat?.incarnation === owner.incarnation && st !== undefined && Date.now() - st.mtimeMs < this.livenessMs;
  }

  /**
   * Takes the session for this process. `base` is its log's path without extension (the lease
   * files sit beside it), `sessionId` names it in errors, `lastEpoch` is the highest epoch its log records. Walks
   * forward over lease files: each one met must belong to a dead owner (or to this process), else
   * the session is live elsewhere and the activation is refused.
   */
  async acquire(base: string, sessionId: string, lastEpoch: number): Promise<Lease> {
    const stale: string[] = [];
    for (let epoch = lastEpoch; ; epoch++) {
      if (epoch > 0) {
        const file = this.leaseFile(base, epoch);
        const holder = await readJson<Owner>(file);
        if (holder) {
          if (await this.alive(holder)) {
            throw new SessionElsewhere(
              `session ${sessionId} is live on runner ${holder.runnerId} (${holder.address}); this runner does not activate a second copy`,
              holder.address,
            );
          }
          stale.push(file);
        }
      }
      const next = this.leaseFile(base, epoch + 1);
      if (!(await createExclusive(next, JSON.stringify(this.self)))) continue; // someone holds or took it: look at them
      // Removing the dead owner's lease is what fences it, should it still be running.
      for (const f of stale) await unlink(f).catch(() => undefined);
      return { epoch: epoch + 1, file: next };
    }
  }

  /**
   * Whether the lease still holds. False means a new owner took the session. Checked after every
   * fsync, so it is a stat on the event loop (about 2 µs on a local disk) rather than a trip
   * through libuv's thread pool, which cost the busy runner more (bench/history.md, "The cost
   * of a turn"); on a shared volume it is one round trip to the file server.
   */
  async holds(lease: Lease): Promise<boolean> {
    try {
      statSync(lease.file);
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw err;
    }
  }

  async release(lease: Lease): Promise<void> {
    await unlink(lease.file).catch(() => undefined);
  }
}

async function readJson<T>(file: string): Promise<T | undefined> {
  try {
    return JSON.parse(await readFile(file, "utf8")) as T;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    throw err;
  }
}
