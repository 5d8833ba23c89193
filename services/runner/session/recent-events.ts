// The last few thousand events of a session, for clients that resume: a circular buffer. Adding an
// event to a full one replaces the oldest in constant time. The array it replaces dropped the
// oldest with splice(0, 1) on every event of a turn that filled it. V8 does that in place only
// while the array is young; once the collector has moved it to the old generation (a long turn on
// a busy runner) every splice moves all 4,096 slots: 7 to 10 µs an event here, against under 1
// for the rest of the journal's work (bench/history.md, bench/journal).
//
// When its session goes idle the buffer packs what it keeps: protobuf bytes, size-delimited, in
// one array. As message objects those events were most of an idle actor's heap (about 400 bytes
// an event: the objects, their out-of-object property arrays, the bigint seq and time); packed,
// about 100. Events that come after stay objects until the next pack, which encodes only them:
// the packed ones are never decoded for a turn, only for a client that replays them.
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { BinaryReader, BinaryWriter } from "@bufbuild/protobuf/wire";
import { type AgentEvent, AgentEventSchema } from "../../shared/gen/troupe/v1/session_pb.js";

const EMPTY = new Uint8Array(0);

export class RecentEvents implements Iterable<AgentEvent> {
  /**
   * The events after the packed ones. Until full, exactly those, oldest first (`start` is 0), so
   * a buffer grows with use; once full (and only with nothing packed) it has `capacity` slots and
   * the oldest is at `start`.
   */
  private slots: AgentEvent[] = [];
  private start = 0;
  /** The oldest events, packed (size-delimited AgentEvent bytes), and how many. */
  private packed = EMPTY;
  private packedCount = 0;

  /** Contract: holds at most `capacity` events (at least 1), the newest ones. */
  constructor(private readonly capacity: number) {
    if (!(capacity >= 1)) throw new RangeError(`capacity must be at least 1, got ${capacity}`);
  }

  get length(): number {
    return this.packedCount + this.slots.length;
  }

  /** The oldest event held, if any. */
  oldest(): AgentEvent | undefined {
    if (this.packedCount > 0) {
      const [first] = this.decodePacked(1);
      return first;
    }
    return this.slots[this.start];
  }

  /** Adds the newest event; when full, the oldest goes. */
  push(event: AgentEvent): void {
    if (this.length >= this.capacity) this.unpack();
    if (this.slots.length < this.capacity) {
      this.slots.push(event);
      return;
    }
    this.slots[this.start] = event;
    this.start = (this.start + 1) % this.capacity;
  }

  /** Keeps only the newest `keep` events, in a buffer of that size (memory for an idle session). */
  trim(keep: number): void {
    this.unpack();
    const n = this.slots.length;
    if (n <= keep) return;
    this.slots = Array.from({ length: keep }, (_, i) => this.slots[(this.start + n - keep + i) % n]);
    this.start = 0;
  }

  /** Keeps the newest `keep` events, packed into bytes (an idle session's); encodes only the unpacked ones. */
  pack(keep: number): void {
    let dropPacked = Math.max(0, this.length - keep);
    const dropSlots = Math.max(0, dropPacked - this.packedCount);
    dropPacked -= dropSlots;
    if (dropPacked === 0 && this.slots.length === 0) return;
    const w = new BinaryWriter();
    const r = new BinaryReader(this.packed);
    for (let i = 0; i < this.packedCount; i++) {
      const bytes = r.bytes();
      if (i >= dropPacked) w.bytes(bytes);
    }
    const fresh = [...this.liveSlots()].slice(dropSlots);
    for (const e of fresh) w.bytes(toBinary(AgentEventSchema, e));
    this.packed = w.finish();
    this.packedCount = this.packedCount - dropPacked + fresh.length;
    this.slots = [];
    this.start = 0;
  }

  *[Symbol.iterator](): Iterator<AgentEvent> {
    yield* this.decodePacked(this.packedCount);
    yield* this.liveSlots();
  }

  private *liveSlots(): Generator<AgentEvent> {
    const n = this.slots.length;
    for (let i = 0; i < n; i++) yield this.slots[(this.start + i) % n];
  }

  /** The first `count` packed events, decoded. */
  private decodePacked(count: number): AgentEvent[] {
    const r = new BinaryReader(this.packed);
    const out: AgentEvent[] = [];
    for (let i = 0; i < count && i < this.packedCount; i++) out.push(fromBinary(AgentEventSchema, r.bytes()));
    return out;
  }

  /** Back to objects only (a full buffer, or a trim). */
  private unpack(): void {
    if (this.packedCount === 0) return;
    const all = [...this];
    this.packed = EMPTY;
    this.packedCount = 0;
    this.slots = all;
    this.start = 0;
  }
}
