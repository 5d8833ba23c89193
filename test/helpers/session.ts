// A test client for one Chat stream: send frames, collect events, wait for what should come.
import { fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import type { LogRecord } from "../../services/runner/session/session-log.js";
import type { GatewayService } from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import type { ChatResponse } from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import {
  AgentEventSchema,
  Role,
  type StopReason,
  type AgentEvent,
  type ClientFrame,
  type SessionOpened,
} from "../../services/shared/gen/troupe/v1/session_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ClientFrameSchema } from "../../services/shared/gen/troupe/v1/session_pb.js";
import type { CallOptions, grpc, ServiceClient } from "../../services/shared/rpc.js";

type Kind = NonNullable<MessageInitShape<typeof ClientFrameSchema>["kind"]>;

export class ChatSession {
  readonly events: AgentEvent[] = [];
  opened?: SessionOpened;
  status?: grpc.StatusObject;
  private waiters: (() => void)[] = [];
  private n = 0;
  readonly call: grpc.ClientDuplexStream<{ frame: MessageInitShape<typeof ClientFrameSchema> }, ChatResponse>;

  /** `options`: the call's, such as metadata carrying the client's own traceparent. */
  constructor(gateway: ServiceClient<(typeof GatewayService)["method"]>, options?: CallOptions) {
    this.call = gateway.chat(options) as never;
    this.call.on("data", (resp: ChatResponse) => {
      if (resp.kind.case === "opened") this.opened = resp.kind.value;
      else if (resp.kind.case === "event") this.events.push(resp.kind.value);
      this.wake();
    });
    this.call.on("status", (s: grpc.StatusObject) => {
      this.status = s;
      this.wake();
    });
    this.call.on("error", () => undefined);
  }

  private wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Frame ids are unique per ChatSession, so two streams on one session never collide. */
  private readonly prefix = Math.random().toString(36).slice(2, 8);

  send(kind: Kind, frameId = `f-${this.prefix}-${++this.n}`): string {
    this.call.write({ frame: { frameId, kind } });
    return frameId;
  }

  open(sessionId = "", create = true): string {
    return this.send({ case: "open", value: { sessionId, create } });
  }

  prompt(text: string): string {
    return this.send({ case: "prompt", value: { text } });
  }

  /** Sends a prompt and resolves with the events of its run, once the run's agent_end arrived. */
  async turn(text: string, timeoutMs = 20_000): Promise<AgentEvent[]> {
    const from = this.events.length;
    this.prompt(text);
    await this.waitFor((e) => e.payload.case === "agentEnd", timeoutMs, from);
    return this.events.slice(from);
  }

  /** Resolves with the first event (after `from`) that matches, or rejects after timeoutMs. */
  async waitFor(match: (e: AgentEvent) => boolean, timeoutMs = 15_000, from = 0): Promise<AgentEvent> {
    let hit: AgentEvent | undefined;
    await this.until(() => (hit = this.events.slice(from).find(match)) !== undefined, timeoutMs);
    return hit!;
  }

  /**
   * Resolves once `condition` (over the whole session so far) holds; checked once per arrival.
   * Deadlines here are on the monotonic clock: a step of the wall clock (a VM paused, NTP) once
   * made a wait of 10 s give up after 1.1 s, with the awaited event on its way.
   */
  async until(condition: () => boolean, timeoutMs = 15_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (!condition()) {
      if (this.status)
        throw new Error(`stream ended (${this.status.code} ${this.status.details}) first; got: ${this.describe()}`);
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`timed out; got: ${this.describe()}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  waitForPayload(kase: AgentEvent["payload"]["case"], timeoutMs?: number, from = 0): Promise<AgentEvent> {
    return this.waitFor((e) => e.payload.case === kase, timeoutMs, from);
  }

  async waitOpened(timeoutMs = 10_000): Promise<SessionOpened> {
    const deadline = performance.now() + timeoutMs;
    while (!this.opened) {
      if (this.status) throw new Error(`stream ended: ${this.status.code} ${this.status.details}`);
      if (performance.now() > deadline) throw new Error("not opened in time");
      await new Promise((r) => setTimeout(r, 20));
    }
    return this.opened;
  }

  async ended(timeoutMs = 15_000): Promise<grpc.StatusObject> {
    const deadline = performance.now() + timeoutMs;
    while (!this.status) {
      if (performance.now() > deadline) throw new Error(`stream did not end; got: ${this.describe()}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    return this.status;
  }

  cases(): string[] {
    return this.events.map((e) => e.payload.case ?? "?");
  }

  describe(): string {
    return this.events
      .map((e) => JSON.stringify(toJson(AgentEventSchema, e)))
      .join("\n")
      .slice(-4000);
  }

  close(): void {
    this.call.cancel();
  }

  /**
   * Half-closes and waits for the server to end the stream (once the session has nothing left to
   * do). Unlike close(), this sends no stream reset: a client that opens and leaves thousands of
   * streams on one connection must leave this way, or the server's HTTP/2 rapid-reset guard
   * (about 1,000 resets in a burst) closes the connection.
   */
  async finish(timeoutMs = 15_000): Promise<grpc.StatusObject> {
    this.call.end();
    await this.until(() => this.status !== undefined, timeoutMs);
    return this.status!;
  }
}

/**
 * Subscribe(after_seq) until `ends` agent_end events have arrived, or, with `untilQuiet`, until
 * nothing has arrived for 300 ms and `untilQuiet(events so far)` holds; returns every event
 * received. A replay may take longer than 300 ms to start (the runner loads the session's log
 * first), so `untilQuiet` should say what a complete answer has, not only `true`.
 */
export async function subscribeUntil(
  gateway: ServiceClient<(typeof GatewayService)["method"]>,
  sessionId: string,
  afterSeq: bigint,
  ends: number,
  untilQuiet?: (got: readonly AgentEvent[]) => boolean,
  timeoutMs = 30_000,
): Promise<AgentEvent[]> {
  const sub = gateway.subscribe({ sessionId, afterSeq });
  const got: AgentEvent[] = [];
  const ended = () => got.filter((e) => e.payload.case === "agentEnd").length;
  const fail = (why: string) =>
    new Error(`subscribe ${sessionId}: ${why} after ${got.length} events, ${ended()} of ${ends} ends`);
  let quiet: NodeJS.Timeout | undefined;
  let giveUp: NodeJS.Timeout | undefined;
  try {
    await new Promise<void>((resolve, reject) => {
      giveUp = setTimeout(() => reject(fail("timed out")), timeoutMs);
      const settle = () => {
        clearTimeout(quiet);
        quiet = setTimeout(() => untilQuiet?.(got) && resolve(), 300);
      };
      if (untilQuiet) settle();
      sub.on("data", (r) => {
        got.push(r.event!);
        if (untilQuiet) settle();
        else if (ended() === ends) resolve();
      });
      sub.on("end", () => reject(fail("stream ended")));
      sub.on("error", (e) => ((e as unknown as { code: number }).code === 1 ? undefined : reject(e)));
    });
  } finally {
    clearTimeout(quiet);
    clearTimeout(giveUp);
    sub.cancel();
  }
  return got;
}

/** Frame id helper for unary calls. */
export const frame = (k: Kind, frameId: string): MessageInitShape<typeof ClientFrameSchema> => ({ frameId, kind: k });
export type { ClientFrame };

/** The events a session's log holds, as stored records (read without loading the session). */
export const loggedEvents = (records: readonly LogRecord[]): AgentEvent[] =>
  records.flatMap((r) => (r.t === "event" ? [fromJson(AgentEventSchema, r.event as JsonValue)] : []));

/** How a run recorded in `events` ended: whether it was resumed, its stop reason, the assistant's answers. */
export function runOutcome(events: readonly AgentEvent[]): {
  resumed: boolean;
  stopReason?: StopReason;
  answers: string[];
} {
  const end = events.find((e) => e.payload.case === "agentEnd");
  return {
    resumed: events.some((e) => e.payload.case === "runResumed"),
    stopReason: end?.payload.case === "agentEnd" ? end.payload.value.stopReason : undefined,
    answers: events.flatMap((e) =>
      e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT
        ? [e.payload.value.message.text]
        : [],
    ),
  };
}

/** The scripted model's whole answer to `!tokens n` (services/dev/scripted-model/rules.ts). */
export const tokensReply = (n: number): string => Array.from({ length: n }, (_, i) => `t${i + 1} `).join("");
