// Runner membership in the PostgreSQL store: each runner keeps a row fresh (its heartbeat), and
// every router reads the live rows, so any number of routers see the same runners. Liveness is
// judged by the database's clock (beat_at against now()), never by the machines' own clocks.
//
// A runner's row names its incarnation (one per process). A session whose lease names an
// incarnation that no longer beats is free for another runner to take (pg-session-store.ts).
import os from "node:os";
import type pg from "pg";

export interface MemberRunner {
  runnerId: string;
  address: string;
}

/** The runners beating within `livenessMs` and not draining: where new sessions may go. */
export async function liveRunners(pool: pg.Pool, livenessMs: number): Promise<MemberRunner[]> {
  const { rows } = await pool.query<{ runner_id: string; address: string }>(
    `SELECT runner_id, address FROM troupe_runners
      WHERE beat_at > now() - $1 * interval '1 millisecond' AND NOT draining ORDER BY runner_id`,
    [livenessMs],
  );
  return rows.map((r) => ({ runnerId: r.runner_id, address: r.address }));
}

/**
 * One runner's row: written at start, refreshed every livenessMs/4, marked draining on SIGTERM and
 * deleted at stop (so its sessions move at once). Refuses to start while another live process on
 * this host beats under the same runner id.
 */
export class RunnerHeartbeat {
  private timer?: NodeJS.Timeout;
  private draining = false;
  private lastBeat = performance.now();

  constructor(
    private readonly pool: pg.Pool,
    readonly self: { runnerId: string; address: string; incarnation: string },
    readonly livenessMs: number,
    /** Called when a beat fails or finds the row taken by a newer process. Contract: never throws. */
    private readonly trouble: (message: string) => void = () => undefined,
    /**
     * Called when a beat lands after a silence long enough that other runners may have judged
     * this one dead (the process was paused, or the store unreachable): whatever it holds in
     * memory may have moved. Contract: never throws.
     */
    private readonly lapsed: (silentMs: number) => void = () => undefined,
  ) {}

  async start(): Promise<void> {
    const { runnerId, address, incarnation } = this.self;
    const { rows } = await this.pool.query<{ host: string; pid: number; fresh: boolean; incarnation: string }>(
      `SELECT host, pid, incarnation, beat_at > now() - $2 * interval '1 millisecond' AS fresh
         FROM troupe_runners WHERE runner_id = $1`,
      [runnerId, this.livenessMs],
    );
    const prev = rows[0];
    if (prev?.fresh && prev.incarnation !== incarnation && prev.host === os.hostname() && processAlive(prev.pid))
      throw new Error(
        `runner id ${runnerId} is in use by process ${prev.pid} on this host; give each runner its own --runner-id`,
      );
    const before = performance.now(); // no later than the beat_at the insert writes
    await this.pool.query(
      `INSERT INTO troupe_runners (runner_id, address, incarnation, host, pid, beat_at, draining)
       VALUES ($1, $2, $3, $4, $5, now(), false)
       ON CONFLICT (runner_id) DO UPDATE SET address = excluded.address, incarnation = excluded.incarnation,
         host = excluded.host, pid = excluded.pid, beat_at = now(), draining = false`,
      [runnerId, address, incarnation, os.hostname(), process.pid],
    );
    this.lastBeat = before;
    this.timer = setInterval(() => void this.beat(), Math.max(20, Math.floor(this.livenessMs / 4)));
    this.timer.unref();
  }

  private async beat(): Promise<void> {
    const started = performance.now();
    try {
      const { rowCount } = await this.pool.query(
        `UPDATE troupe_runners SET beat_at = now(), draining = $3 WHERE runner_id = $1 AND incarnation = $2`,
        [this.self.runnerId, this.self.incarnation, this.draining],
      );
      if (rowCount === 0) this.trouble(`runner id ${this.self.runnerId} was taken by a newer process`);
      // The row was at most this old at any moment since the last beat: from that beat's start
      // (its beat_at is no earlier) to now (this one's beat_at is no later). Under the lease, no
      // runner can have judged this one dead. Measured from the previous beat's end, with half
      // the lease as the bound, an event loop busy for a second under load handed sessions over
      // (their runs cut and resumed) though nobody could have taken them.
      const silent = performance.now() - this.lastBeat;
      this.lastBeat = started;
      if (silent > this.livenessMs * 0.8) this.lapsed(Math.round(silent));
    } catch (err) {
      this.trouble(`heartbeat failed: ${(err as Error).message}`);
    }
  }

  /** Stops new sessions coming here (routers skip draining runners); the sessions held stay held. */
  async drain(): Promise<void> {
    this.draining = true;
    await this.beat();
  }

  /** Leaves: the row goes, and with it every lease this process held. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.pool
      .query("DELETE FROM troupe_runners WHERE runner_id = $1 AND incarnation = $2", [
        this.self.runnerId,
        this.self.incarnation,
      ])
      .catch(() => undefined);
  }
}

/** Whether a process of this host is alive (EPERM: alive, another user's). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
