// The soak's traffic and its checks, shared by the one-runner soak (soak.test.ts) and the cluster
// soak (cluster.test.ts). Clients behave as real ones must: when a stream breaks they reconnect,
// resume from the last seq they saw and resend every frame not yet acknowledged, with the same
// ids. Afterwards every acknowledged message is in its session's history exactly once; in
// sessions that use only first-in-first-out lanes (followup prompts and follow-ups), in the order
// it was acknowledged.
import assert from "node:assert/strict";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { GatewayService } from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import { QueueMode, Role, type ClientFrameSchema } from "../../services/shared/gen/troupe/v1/session_pb.js";
import type { ServiceClient } from "../../services/shared/rpc.js";
import { ChatSession, subscribeUntil } from "../helpers/session.js";
import { LOAD_QUOTAS, waitFor } from "../helpers/stack.js";

type GatewayClient = ServiceClient<(typeof GatewayService)["method"]>;

/** What the soak's stacks share: one tenant sends thousands of frames a second, so the limits are not what this tests. */
export const SOAK_ENV = {
  ...LOAD_QUOTAS,
  TROUPE_LOG_LEVEL: "warn",
  TROUPE_MEMORY_CONTEXT_K: "0",
  TROUPE_TENANT_RATE: "1000000",
  TROUPE_TENANT_BURST: "1000000",
};

type Kind = NonNullable<MessageInitShape<typeof ClientFrameSchema>["kind"]>;
interface Planned {
  id: string;
  kind: Kind;
  /** A message that must reach the history (not an abort). */
  message: boolean;
}

// A small deterministic generator, so a failure can be reproduced with the same seed.
function rng(seed: number) {
  let s = seed >>> 0;
  return () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
}

function plan(i: number, ordered: boolean, rand: () => number): Planned[] {
  const n = 4 + Math.floor(rand() * 5);
  const out: Planned[] = [];
  for (let j = 0; j < n; j++) {
    const id = `s${i}-f${j}`;
    const text = `!tokens ${5 + Math.floor(rand() * 35)} rate=${200 + Math.floor(rand() * 800)}`;
    const r = rand();
    if (ordered) {
      out.push(
        r < 0.5
          ? { id, kind: { case: "prompt", value: { text, queueMode: QueueMode.FOLLOWUP } }, message: true }
          : { id, kind: { case: "followUp", value: { text } }, message: true },
      );
      continue;
    }
    if (r < 0.15) out.push({ id, kind: { case: "abort", value: { reason: "soak" } }, message: false });
    else if (r < 0.3) out.push({ id, kind: { case: "steer", value: { text } }, message: true });
    else if (r < 0.45) out.push({ id, kind: { case: "followUp", value: { text } }, message: true });
    else {
      const modes = [QueueMode.UNSPECIFIED, QueueMode.FOLLOWUP, QueueMode.COLLECT, QueueMode.INTERRUPT];
      out.push({
        id,
        kind: { case: "prompt", value: { text, queueMode: modes[Math.floor(rand() * modes.length)] } },
        message: true,
      });
    }
  }
  return out;
}

export class SoakClient {
  readonly acked = new Map<string, number>();
  private lastSeq = 0n;
  private stream?: ChatSession;
  private sent = 0;
  reconnects = 0;
  readonly ackLog: { id: string; seq: number; dup: boolean; stream: number }[] = [];
  lastError = "";

  constructor(
    private readonly gateway: GatewayClient,
    readonly sessionId: string,
    readonly frames: Planned[],
    private readonly rand: () => number,
  ) {}

  async run(): Promise<void> {
    for (;;) {
      try {
        await this.connectAndSend();
        return;
      } catch (err) {
        this.lastError = String((err as Error).message).slice(0, 120);
        this.reconnects++;
        this.stream?.close();
        await new Promise((r) => setTimeout(r, 100 + this.rand() * 200));
      }
    }
  }

  private async connectAndSend(): Promise<void> {
    const s = new ChatSession(this.gateway);
    this.stream = s;
    // Always resume: from 0 the first time, so acknowledgements a broken stream never delivered
    // are seen as they were, not only as the duplicates a resend gets.
    s.send({ case: "open", value: { sessionId: this.sessionId, create: true, replayAfterSeq: this.lastSeq } });
    const seen = () => {
      for (const e of s.events) {
        if (e.seq > this.lastSeq) this.lastSeq = e.seq;
        if (e.payload.case === "frameAccepted" && !this.ackLog.some((a) => a.seq === Number(e.seq))) {
          this.ackLog.push({
            id: e.payload.value.frameId,
            seq: Number(e.seq),
            dup: e.payload.value.duplicate,
            stream: this.reconnects,
          });
        }
        if (e.payload.case === "frameAccepted" && !this.acked.has(e.payload.value.frameId))
          this.acked.set(e.payload.value.frameId, Number(e.seq));
      }
    };
    try {
      await s.waitOpened(5000);
    } finally {
      seen();
    }
    // Resend what was sent but never acknowledged, in order, then go on with the plan.
    for (const f of this.frames.slice(0, this.sent)) if (!this.acked.has(f.id)) s.send(f.kind, f.id);
    while (this.sent < this.frames.length) {
      await new Promise((r) => setTimeout(r, this.rand() * 60));
      seen();
      if (s.status) throw new Error(`stream ended: ${s.status.code} ${s.status.details}`);
      const f = this.frames[this.sent++];
      s.send(f.kind, f.id);
    }
    try {
      await s.until(() => {
        seen();
        return this.frames.every((f) => this.acked.has(f.id));
      }, 30_000);
    } finally {
      seen();
    }
    s.close();
  }
}

export interface SoakOptions {
  sessions: number;
  /** Client i talks to gateways[i % n]; histories are read through the first. */
  gateways: GatewayClient[];
  disruptions: number;
  /** The k-th disruption (a runner killed and started again, say); returns what it did, for the debug log. */
  disrupt(k: number): Promise<string>;
  /** A session's stored log as text, for the message of an ordering failure. */
  rawLog(sessionId: string): Promise<string>;
  /** Every process's output, written to /tmp/soak-stack.log under SOAK_DEBUG. */
  logs(): string;
}

/** Runs the traffic with its disruptions and asserts that nothing acknowledged was lost, reordered or run twice. */
export async function runSoak({ sessions, gateways, disruptions, disrupt, rawLog, logs }: SoakOptions): Promise<void> {
  const rand = rng(20261122);
  const clients = Array.from(
    { length: sessions },
    (_, i) => new SoakClient(gateways[i % gateways.length], `soak-${i}`, plan(i, i % 2 === 0, rand), rng(i + 1)),
  );
  const traffic = Promise.all(
    clients.map((c, i) => new Promise((r) => setTimeout(r, (i % 50) * 20)).then(() => c.run())),
  );

  for (let k = 0; k < disruptions; k++) {
    await new Promise((r) => setTimeout(r, 1500));
    const what = await disrupt(k);
    if (process.env.SOAK_DEBUG) console.error(`soak: ${what} (${k + 1})`);
  }
  const progress = setInterval(() => {
    if (!process.env.SOAK_DEBUG) return;
    const done = clients.filter((c) => c.frames.every((f) => c.acked.has(f.id))).length;
    const stuck = clients.filter((c) => !c.frames.every((f) => c.acked.has(f.id))).slice(0, 3);
    console.error(
      `soak: ${done}/${clients.length} fully acknowledged; reconnects ${clients.reduce((n, c) => n + c.reconnects, 0)}; e.g. ${stuck.map((c) => `${c.sessionId} ${c.acked.size}/${c.frames.length} r${c.reconnects} ${c.lastError}`).join(" | ")}`,
    );
  }, 2000);
  if (process.env.SOAK_DEBUG)
    setTimeout(() => import("node:fs").then((fs) => fs.writeFileSync("/tmp/soak-stack.log", logs())), 25_000).unref();
  await traffic.finally(() => clearInterval(progress));
  if (disruptions > 0) assert.ok(clients.reduce((n, c) => n + c.reconnects, 0) >= 1, "the disruptions broke streams");

  const expected = (c: SoakClient) => c.frames.filter((f) => f.message).map((f) => f.id);
  const histories = new Map<string, string[]>();
  const missing = () =>
    clients
      .filter((c) => !histories.has(c.sessionId))
      .slice(0, 5)
      .map((c) => `${c.sessionId} (acked ${[...c.acked.keys()].join(",")})`)
      .join("; ");
  await waitFor(
    "every acknowledged message in its history",
    async () => {
      for (const c of clients) {
        if (histories.has(c.sessionId)) continue;
        const h = await gateways[0].getHistory({ sessionId: c.sessionId, pageSize: 1000 });
        const ids = h.messages.filter((m) => m.role === Role.USER).map((m) => m.frameId);
        if (expected(c).every((id) => ids.includes(id))) histories.set(c.sessionId, ids);
      }
      return histories.size === clients.length;
    },
    120_000,
    500,
  ).catch((err: Error) => {
    throw new Error(`${err.message}; still missing in: ${missing()}`);
  });
  // Let anything that would run twice have the chance to, then read the histories again.
  await new Promise((r) => setTimeout(r, 2000));
  let ordered = 0;
  for (const [i, c] of clients.entries()) {
    const h = await gateways[0].getHistory({ sessionId: c.sessionId, pageSize: 1000 });
    const ids = h.messages.filter((m) => m.role === Role.USER).map((m) => m.frameId);
    const want = expected(c);
    assert.deepEqual([...ids].sort(), [...want].sort(), `${c.sessionId}: every acknowledged message exactly once`);
    // The session's own record of acknowledgements (first, non-duplicate frame_accepted of each
    // frame), read back through the public API; every acknowledgement the client saw is in it.
    // Read until the replay has started and paused. "Quiet for 300 ms" alone counts a replay
    // that has not started yet (the runner loads the session's log first) as an empty record;
    // the check below then fails on the session's first frame, as it did once in CI
    // (2026-11-28: soak-16's f0, with the history complete and sessions 0 to 15 passing).
    const replay = await subscribeUntil(gateways[0], c.sessionId, 0n, 0, (got) => got.length > 0);
    const record = replay.filter((e) => e.payload.case === "frameAccepted");
    const firstAck = new Map<string, number>();
    for (const e of record)
      if (e.payload.case === "frameAccepted" && !e.payload.value.duplicate && !firstAck.has(e.payload.value.frameId))
        firstAck.set(e.payload.value.frameId, Number(e.seq));
    // A frame is durable before its acknowledgement is sent, but the acknowledgement event itself
    // may die with a killed runner after the client saw it; the reload acknowledges it again. So a
    // frame's acknowledgement is the earliest either side has.
    for (const [id, seq] of c.acked) {
      assert.ok(firstAck.has(id), `${c.sessionId}: ${id} acknowledged at ${seq} but not in the session's record`);
      firstAck.set(id, Math.min(firstAck.get(id)!, seq));
    }
    if (i % 2 === 0) {
      const byAck = [...want].sort((a, b) => firstAck.get(a)! - firstAck.get(b)!);
      if (JSON.stringify(ids) !== JSON.stringify(byAck)) {
        // Everything needed to tell why: what the client saw, and the session's log as written.
        const raw = await rawLog(c.sessionId);
        const digest = raw
          .split("\n")
          .filter(Boolean)
          .map((l) => {
            const r = JSON.parse(l) as {
              e?: number;
              t: string;
              frame?: { frameId: string };
              event?: Record<
                string,
                { frameId?: string; duplicate?: boolean; message?: { frameId?: string; role?: string } } & {
                  seq?: string;
                }
              >;
              upTo?: number;
              epoch?: number;
            };
            const ev = r.event ?? {};
            const kind = Object.keys(ev).find((k) => !["sessionId", "seq", "turnId", "time"].includes(k)) ?? "";
            const v = ev[kind] ?? {};
            return `${r.e ?? "-"}:${r.t}${r.frame ? ` ${r.frame.frameId}` : ""}${r.upTo ? ` ${r.upTo}` : ""}${r.epoch ? ` ${r.epoch}` : ""}${r.event ? ` #${String(ev.seq)} ${kind}${v.frameId ? ` ${v.frameId}` : ""}${v.duplicate ? " dup" : ""}${v.message?.role === "ROLE_USER" ? ` user ${v.message.frameId}` : ""}` : ""}`;
          });
        assert.fail(
          `${c.sessionId}: not in the order acknowledged: history ${ids.join(",")} vs ${byAck.join(",")}\nclient acks: ${JSON.stringify(c.ackLog)}\nlog:\n${digest.join("\n")}`,
        );
      }
      ordered++;
    }
  }
  assert.equal(ordered, Math.ceil(sessions / 2));
}
