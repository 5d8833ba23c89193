// SubscribeInbox: one stream of every event of every session a caller owns, for channel adapters
// that serve thousands of chats and cannot hold a Subscribe per chat. The gateway holds a runner
// stream only for sessions with something to say: it lists the caller's sessions every
// POLL_MS (and at once when a Deliver through this gateway touches one), attaches to those with
// events the client has not had, and leaves a session that has been quiet for IDLE_DETACH_MS.
// Backpressure: when the client stops reading, every runner stream of its inbox pauses.
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { Identity } from "../shared/auth/auth.js";
import { Status, grpcCode, toStatus } from "../shared/errors.js";
import type { SubscribeInboxResponse } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { AttachResponse } from "../shared/gen/troupe/v1/runner_pb.js";
import type { AgentEvent, SessionInfo } from "../shared/gen/troupe/v1/session_pb.js";
import type { Logger } from "../shared/process/log.js";
import type { grpc } from "../shared/rpc.js";
import { decodeCursor, encodeCursor } from "./inbox-cursor.js";
import { answerWithin, decodeRunnerResponse, leaveRunnerCall, type AttachRequestInit } from "./passthrough.js";
import type { PlacementCache, RunnerPool } from "./placement.js";

const POLL_MS = 2000;
const IDLE_DETACH_MS = 30_000;
/** How far the cursor's watermark lags the newest event (inbox-cursor.ts). */
const WATERMARK_LAG_MS = 60_000;

export interface InboxDeps {
  placements: PlacementCache;
  runners: RunnerPool;
  /** The caller's sessions (session-listing.ts). */
  list(caller: grpc.Metadata): Promise<Map<string, SessionInfo>>;
  hints: InboxHints;
  logger: Logger;
}

/** Sessions a Deliver just touched, told to the inboxes of their owner so they attach without waiting for a poll. */
export class InboxHints {
  private readonly listeners = new Map<string, Set<(sessionId: string) => void>>();
  listen(owner: Identity, fn: (sessionId: string) => void): () => void {
    const key = `${owner.tenant}\0${owner.principal}`;
    let set = this.listeners.get(key);
    if (!set) this.listeners.set(key, (set = new Set()));
    set.add(fn);
    return () => {
      set.delete(fn);
      if (set.size === 0) this.listeners.delete(key);
    };
  }
  touched(owner: Identity, sessionId: string): void {
    for (const fn of this.listeners.get(`${owner.tenant}\0${owner.principal}`) ?? []) fn(sessionId);
  }
}

/** What the inbox knows of one session. */
interface Known {
  /** The last seq handed to the client; undefined: none yet, and events at or before floorMs count as handed over. */
  seq?: number;
  floorMs: number;
  lastEventMs: number;
  /** The session's update time when last listed or attached: later activity shows as a newer one. */
  seenUpdateMs: number;
  /** Its runner stream failed: attach again at the next poll. */
  retry: boolean;
}

type Upstream = grpc.ClientDuplexStream<AttachRequestInit, Buffer>;

/** When a listed session last changed (its runner's clock). */
const updateMsOf = (info: SessionInfo): number => (info.updateTime ? Number(timestampMs(info.updateTime)) : 0);

export class InboxStream {
  private readonly known = new Map<string, Known>();
  private readonly attached = new Map<string, { call: Upstream; idle: NodeJS.Timeout }>();
  /** Sessions whose runner stream is being opened. */
  private readonly attaching = new Set<string>();
  private watermarkMs = 0;
  private newestEventMs = 0;
  /** When the last complete listing began: activity before it has been seen (attached, or caught up). */
  private listedAtMs = 0;
  private paused = false;
  private closed = false;
  private listing = false;
  private poller?: NodeJS.Timeout;
  private unlisten?: () => void;

  constructor(
    private readonly deps: InboxDeps,
    private readonly who: Identity,
    private readonly caller: grpc.Metadata,
    private readonly write: (res: SubscribeInboxResponse) => boolean,
    private readonly onDrain: (fn: () => void) => void,
  ) {}

  /** Lists the sessions, attaches those with events after the cursor, then watches. Rejects on a bad cursor or no runner. */
  async start(afterCursor: string): Promise<void> {
    const cursor = decodeCursor(afterCursor);
    this.watermarkMs = cursor.watermarkMs;
    this.listedAtMs = Date.now();
    const sessions = await this.deps.list(this.caller);
    if (this.closed) return;
    for (const [id, info] of sessions) {
      const updateMs = updateMsOf(info);
      const seq = cursor.seqs.get(id);
      if (seq !== undefined) {
        // Its last event is replayed too (attach), so that its time is known again.
        this.known.set(id, { seq, floorMs: 0, lastEventMs: this.watermarkMs, seenUpdateMs: updateMs, retry: false });
        this.attach(id);
      } else if (updateMs >= this.watermarkMs) {
        // Active since the watermark, and the cursor names none of it: what is at or after it is new.
        this.known.set(id, { floorMs: this.watermarkMs - 1, lastEventMs: 0, seenUpdateMs: updateMs, retry: false });
        this.attach(id);
      } else {
        this.known.set(id, { floorMs: updateMs, lastEventMs: 0, seenUpdateMs: updateMs, retry: false });
      }
    }
    this.unlisten = this.deps.hints.listen(this.who, (id) => this.wake(id));
    this.poller = setInterval(() => this.poll(), POLL_MS);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.poller);
    this.unlisten?.();
    for (const { call, idle } of this.attached.values()) {
      clearTimeout(idle);
      leaveRunnerCall(call);
    }
    this.attached.clear();
  }

  /** A session made after the stream started: every event of it is new. */
  private wake(id: string): void {
    if (this.closed || this.engaged(id)) return;
    if (!this.known.has(id)) this.known.set(id, { floorMs: -1, lastEventMs: 0, seenUpdateMs: 0, retry: false });
    this.attach(id);
  }

  private async poll(): Promise<void> {
    // A listing slower than the interval is not stacked up behind another.
    if (this.listing) return;
    this.listing = true;
    let sessions: Map<string, SessionInfo>;
    const listedAtMs = Date.now();
    try {
      sessions = await this.deps.list(this.caller);
    } catch (err) {
      this.deps.logger.warn("inbox could not list sessions; trying again", { error: String(err) });
      return;
    } finally {
      this.listing = false;
    }
    if (this.closed) return;
    this.listedAtMs = listedAtMs;
    for (const [id, info] of sessions) {
      if (this.engaged(id)) continue;
      const k = this.known.get(id);
      if (!k) {
        this.wake(id);
        continue;
      }
      const updateMs = updateMsOf(info);
      const live = info.lastSeq > 0n;
      const behind =
        live && k.seq !== undefined ? Number(info.lastSeq) > k.seq : updateMs > Math.max(k.seenUpdateMs, k.lastEventMs);
      if (behind || k.retry) {
        k.seenUpdateMs = Math.max(k.seenUpdateMs, updateMs);
        this.attach(id);
      }
    }
    for (const id of this.known.keys()) if (!sessions.has(id) && !this.engaged(id)) this.known.delete(id);
  }

  private attach(id: string): void {
    const k = this.known.get(id)!;
    k.retry = false;
    this.attaching.add(id);
    this.deps.placements
      .resolve(this.who, id, "")
      .then((placement) => {
        this.attaching.delete(id);
        if (this.closed || this.attached.has(id)) return;
        const call = this.deps.runners.attach(placement.runner!.address, this.caller) as unknown as Upstream;
        const entry = { call, idle: setTimeout(() => this.leave(id), IDLE_DETACH_MS) };
        this.attached.set(id, entry);
        if (this.paused) call.pause();
        const answer = answerWithin(call);
        let failed = false;
        call.on("data", (bytes: Buffer) => {
          answer.heard();
          let res: AttachResponse;
          try {
            res = decodeRunnerResponse(bytes);
          } catch (err) {
            this.lost(id, entry, err);
            call.cancel();
            return;
          }
          if (res.kind.case === "event") this.handOver(res.kind.value);
          if (this.attached.get(id) === entry) entry.idle.refresh();
        });
        call.on("error", (error) => {
          failed = true;
          this.lost(id, entry, answer.error(error));
        });
        call.on("end", () => failed || this.lost(id, entry, undefined));
        call.write({
          frame: {
            frameId: "inbox",
            kind: {
              case: "open",
              value: { sessionId: id, create: false, replayAfterSeq: BigInt(Math.max((k.seq ?? 0) - 1, 0)) },
            },
          },
        });
      })
      .catch((err) => {
        this.attaching.delete(id);
        this.lost(id, undefined, err);
      });
  }

  /** A runner stream ended or failed: a deleted session is forgotten; anything else is attached again at the next poll. */
  private lost(id: string, entry: { call: Upstream; idle: NodeJS.Timeout } | undefined, err: unknown): void {
    if (entry) {
      if (this.attached.get(id) !== entry) return;
      clearTimeout(entry.idle);
      this.attached.delete(id);
    }
    if (this.closed) return;
    const code = err === undefined ? undefined : grpcCode(err);
    if (code === Status.NOT_FOUND) {
      this.known.delete(id);
      return;
    }
    if (err !== undefined) {
      if (code === Status.UNAVAILABLE || code === Status.ABORTED) this.deps.placements.reroute(this.who, id, err);
      this.deps.logger.warn("inbox lost a session's stream; attaching again", {
        sessionId: id,
        error: toStatus(err).details,
      });
    }
    const k = this.known.get(id);
    if (k) k.retry = true;
  }

  /** A quiet session: its runner stream is let go; a poll attaches it again when it speaks. */
  private leave(id: string): void {
    const entry = this.attached.get(id);
    if (!entry) return;
    if (this.paused) {
      entry.idle.refresh();
      return;
    }
    this.attached.delete(id);
    leaveRunnerCall(entry.call);
  }

  private handOver(event: AgentEvent): void {
    if (this.closed) return;
    const id = event.sessionId;
    const k = this.known.get(id);
    if (!k) return;
    const seq = Number(event.seq);
    const timeMs = event.time ? Number(timestampMs(event.time)) : 0;
    if (k.seq !== undefined ? seq <= k.seq : timeMs <= k.floorMs) {
      // Handed over before (a replay overlapping the cursor); still, it says where this session stands.
      k.seq = Math.max(k.seq ?? 0, seq);
      k.lastEventMs = Math.max(k.lastEventMs, timeMs);
      return;
    }
    k.seq = seq;
    k.lastEventMs = Math.max(k.lastEventMs, timeMs);
    this.newestEventMs = Math.max(this.newestEventMs, timeMs);
    // Never past the last listing: a session whose activity no listing has shown yet must not drop out.
    const candidate = Math.min(Date.now(), this.newestEventMs, this.listedAtMs) - WATERMARK_LAG_MS;
    this.watermarkMs = Math.max(this.watermarkMs, candidate);
    if (!this.write({ event, cursor: this.cursor() } as SubscribeInboxResponse)) this.pause();
  }

  private cursor(): string {
    const seqs = new Map<string, number>();
    for (const [id, k] of this.known)
      if (k.seq !== undefined && (this.engaged(id) || k.retry || k.lastEventMs >= this.watermarkMs))
        seqs.set(id, k.seq);
    return encodeCursor({ watermarkMs: this.watermarkMs, seqs });
  }

  private engaged(id: string): boolean {
    return this.attached.has(id) || this.attaching.has(id);
  }

  private pause(): void {
    if (this.paused) return;
    this.paused = true;
    for (const { call } of this.attached.values()) call.pause();
    this.onDrain(() => {
      this.paused = false;
      if (this.closed) return;
      for (const { call } of this.attached.values()) call.resume();
    });
  }
}
