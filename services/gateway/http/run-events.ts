// The events of one run, for the faces that answer a request with a run (the OpenAI endpoint,
// the Responses API, A2A): followed live (runEvents; a subscription that breaks the way a
// runner's restart breaks it is made again after the last seq seen, shared/resume-policy.ts), or
// read as they stand (runSnapshot). A run is named by a RunRef, which the Responses API and A2A
// hand out as ids: `<prefix><session id, base64url>.<seq>.<p|c><frame>`; p, the run the prompt
// of that frame started; c, the rest of a waiting run, from the client result of that frame on.
// An id is looked up under the caller's key like any session, so it names nothing of anyone else's.
import { randomUUID } from "node:crypto";
import type { ChatResponse } from "../../shared/gen/troupe/v1/gateway_pb.js";
import type { AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { Status } from "../../shared/errors.js";
import { RESUME_FOR_MS, resumable, resumeDelayMs } from "../../shared/resume-policy.js";
import type { GatewayClient } from "./edge.js";
import type { forwardedMetadata } from "./metadata.js";
import { ApiError, apiErrorOf } from "./openai-request.js";

/**
 * The events of the run `frameId` started (or, with `joins`, of the run the first event `joins`
 * accepts belongs to: one that goes on after a wait), from after `afterSeq` until its agent_end.
 */
export async function* runEvents(
  gateway: GatewayClient,
  opts: {
    sessionId: string;
    afterSeq: bigint;
    frameId: string;
    metadata: ReturnType<typeof forwardedMetadata>;
    signal: AbortSignal;
    resumeForMs?: number;
    joins?: (event: AgentEvent) => boolean;
  },
): AsyncGenerator<AgentEvent> {
  let afterSeq = opts.afterSeq;
  let turnId = "";
  let lostSince: number | undefined;
  for (;;) {
    const stream = gateway.subscribe(
      { sessionId: opts.sessionId, afterSeq },
      { metadata: opts.metadata, signal: opts.signal },
    );
    try {
      for await (const { event } of stream) {
        if (!event) continue;
        lostSince = undefined;
        if (event.seq > afterSeq) afterSeq = event.seq;
        const p = event.payload;
        if (!turnId) {
          if (opts.joins ? opts.joins(event) : p.case === "agentStart" && p.value.frameId === opts.frameId)
            turnId = event.turnId;
          else if (p.case === "messageBlocked" && p.value.frameId === opts.frameId)
            throw new ApiError(
              400,
              `the message was blocked (${p.value.check}): ${p.value.reason}`,
              "invalid_request_error",
              "content_filter",
            );
          else if (p.case === "error" && p.value.frameId === opts.frameId)
            throw apiErrorOf({ code: Status[p.value.code as keyof typeof Status], details: p.value.message });
          if (!turnId) continue;
        }
        // A replay's gap belongs to no turn; the run's reader needs it (its deltas have a hole).
        if (event.turnId !== turnId && p.case !== "gap") continue;
        yield event;
        if (p.case === "agentEnd") return;
      }
    } catch (err) {
      if (err instanceof ApiError) throw err;
      if (opts.signal.aborted || !resumable(err)) throw err;
      lostSince ??= Date.now();
      const lostMs = Date.now() - lostSince;
      if (lostMs > (opts.resumeForMs ?? RESUME_FOR_MS)) throw err;
      await new Promise((r) => setTimeout(r, resumeDelayMs(lostMs)));
      continue;
    }
    throw new ApiError(503, "the session's event stream ended before its run did", "server_error");
  }
}

export interface RunRef {
  sessionId: string;
  /** The run's events come after this seq. */
  afterSeq: bigint;
  /** p: a prompt's run; c: a waiting run's rest, joined at a client result. */
  kind: "p" | "c";
  frameId: string;
}

export const runIdOf = (prefix: string, r: RunRef): string =>
  `${prefix}${Buffer.from(r.sessionId).toString("base64url")}.${r.afterSeq}.${r.kind}${r.frameId}`;

/** The run an id names; undefined for one this server did not make. */
export function runRefOf(prefix: string, id: string): RunRef | undefined {
  if (!id.startsWith(prefix)) return undefined;
  const m = /^([A-Za-z0-9_-]{1,400})\.(\d{1,20})\.([pc])([A-Za-z0-9_-]{1,80})$/.exec(id.slice(prefix.length));
  if (!m) return undefined;
  const sessionId = Buffer.from(m[1], "base64url").toString("utf8");
  if (Buffer.from(sessionId).toString("base64url") !== m[1]) return undefined;
  return { sessionId, afterSeq: BigInt(m[2]), kind: m[3] as "p" | "c", frameId: m[4] };
}

/** The first event of the run a ref names: its prompt's agent_start, or the client result that joined it. */
export const joinsOf = (ref: RunRef) =>
  ref.kind === "c"
    ? (e: AgentEvent) => e.payload.case === "clientToolAnswered" && e.payload.value.frameId === ref.frameId
    : (e: AgentEvent) => e.payload.case === "agentStart" && e.payload.value.frameId === ref.frameId;

/** A run as its session's log holds it now. */
export interface RunSnapshot {
  /** The session's agent. */
  agentId: string;
  /** The run's events (none before it started), with any replay gap. */
  events: AgentEvent[];
  /** Whether its prompt (or client result) is in the log: false when the ref names nothing. */
  accepted: boolean;
  /** When its prompt was taken, in seconds. */
  acceptedAt: number;
  /** The seq of the event that took its prompt (0n when not accepted). */
  acceptedSeq: bigint;
  /** With toPresent: whether another run of the session started after it. */
  later: boolean;
}

/**
 * The run `ref` names, read from a session stream opened without creating (NOT_FOUND for a
 * session that is not the caller's) up to the last seq it reported at its open; without
 * `toPresent`, only to the run's end.
 */
export async function runSnapshot(
  gateway: GatewayClient,
  ref: RunRef,
  metadata: ReturnType<typeof forwardedMetadata>,
  toPresent = false,
): Promise<RunSnapshot> {
  const joins = joinsOf(ref);
  const call = gateway.chat({ metadata, timeoutMs: 30_000 });
  const read: AgentEvent[] = [];
  let agentId = "";
  let turnId = "";
  try {
    call.write({
      frame: {
        frameId: `read-${randomUUID()}`,
        kind: { case: "open", value: { sessionId: ref.sessionId, create: false, replayAfterSeq: ref.afterSeq } },
      },
    });
    let last = -1n;
    for await (const res of call as AsyncIterable<ChatResponse>) {
      if (res.kind.case === "opened") {
        agentId = res.kind.value.agentId;
        last = res.kind.value.lastSeq;
        if (last <= ref.afterSeq) break;
      } else if (res.kind.case === "event") {
        const e = res.kind.value;
        read.push(e);
        if (!turnId && joins(e)) turnId = e.turnId;
        const ended = turnId !== "" && e.turnId === turnId && e.payload.case === "agentEnd";
        if ((ended && !toPresent) || e.seq >= last) break;
      }
    }
  } finally {
    call.cancel();
  }
  const taken = read.find(
    (e) => joins(e) || (e.payload.case === "frameAccepted" && e.payload.value.frameId === ref.frameId),
  );
  return {
    agentId,
    events: turnId === "" ? [] : read.filter((e) => e.turnId === turnId || e.payload.case === "gap"),
    accepted: taken !== undefined,
    acceptedAt: secondsOf(taken),
    acceptedSeq: taken?.seq ?? 0n,
    later: read.some((e) => e.payload.case === "agentStart" && turnId !== "" && e.turnId !== turnId),
  };
}

/**
 * Cancels a run by an abort sent once the run has started: an abort stops its session's running
 * run, so a run still queued behind another one of its session is aborted only when it starts,
 * leaving the other alone. Looks at the run (`look`) every 100 ms until it is done or `waitMs` has
 * passed; the last look, and whether the abort was sent.
 */
export async function cancelOnceStarted<T>(
  look: () => Promise<T>,
  run: { started(v: T): boolean; done(v: T): boolean; abort(v: T): Promise<unknown> },
  waitMs: number,
): Promise<{ last: T; aborted: boolean }> {
  const deadline = Date.now() + waitMs;
  let aborted = false;
  for (;;) {
    const last = await look();
    if (run.done(last) || Date.now() > deadline) return { last, aborted };
    if (!aborted && run.started(last)) {
      aborted = true;
      await run.abort(last);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * When an acknowledgement's event was logged, in seconds: a response's `created_at`, the same
 * whether it is streamed live or read back from the log.
 */
export const secondsOf = (e?: AgentEvent) => Number(e?.time?.seconds ?? BigInt(Math.floor(Date.now() / 1000)));
