// The last few thousand events of a session, for clients that resume: a circular buffer. Adding an
// event to a full one replaces the oldest in constant time. The array it replaces dropped the
// oldest with splice(0, 1) on every event of a turn that filled it. V8 does that in place only
// while the array is young; once the collector has moved it to the old generation (a long turn on
// a busy runner) every splice moves all 4,096 slots: 7 to 10 µs an event here, against under 1
// for the rest of the journal's work (bench/history.md, bench/journal).
import type { AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";

export class RecentEvents implements Iterable<AgentEvent> {
  /**
   * Until full, `slots` holds exactly the events, oldest first (`start` is 0), so a buffer grows
   * with use and an idle session's stays the size it was trimmed to. Once full it has `capacity`
   * slots and the oldest is at `start`.
   */
  private slots: AgentEvent[] = [];
  private start = 0;

  /** Contract: holds at most `capacity` events (at least 1), the newest ones. */
  constructor(private readonly capacity: number) {
    if (!(capacity >= 1)) throw new RangeError(`capacity must be at least 1, got ${capacity}`);
  }

  get length(): number {
    return this.slots.length;
  }

  /** The oldest event held, if any. */
  oldest(): AgentEvent | undefined {
    return this.slots[this.start];
  }

  /** Adds the newest event; when full, the oldest goes. */
  push(event: AgentEvent): void {
    if (this.slots.length < this.capacity) {
      this.slots.push(event);
      return;
    }
    this.slots[this.start] = event;
    this.start = (this.start + 1) % this.capacity;
  }

  /** Keeps only the newest `keep` events, in a buffer of that size (memory for an idle session). */
  trim(keep: number): void {
    const n = this.slots.length;
    if (n <= keep) return;
    this.slots = Array.from({ length: keep }, (_, i) => this.slots[(this.start + n - keep + i) % n]);
    this.start = 0;
  }

  *[Symbol.iterator](): Iterator<AgentEvent> {
    const n = this.slots.length;
    for (let i = 0; i < n; i++) yield this.slots[(this.start + i) % n];
  }
}
