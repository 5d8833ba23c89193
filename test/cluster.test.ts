// Three runners, two routers and two gateways on one PostgreSQL store (a throwaway server from
// Debian's package): what a deployment of more than one replica must hold to.
// - A runner paused past its lease (SIGSTOP) loses its sessions to the others; when it wakes it
//   serves nothing from memory, so a client resuming through any gateway sees every event.
// - A rolling restart (SIGTERM to each runner in turn) during traffic aborts no turn.
// - A schedule fires once per due time, not once per runner.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { placeOn } from "../services/router/server.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { PgSessionStore } from "../services/runner/store/pg-session-store.js";
import { openPool } from "../services/shared/pg.js";
import { Role, StopReason, ToolVerdict, type AgentEvent } from "../services/shared/gen/troupe/v1/session_pb.js";
import { createClient, type ServiceClient } from "../services/shared/rpc.js";
import { refKey, refOf } from "../services/shared/session-ref.js";
import { testPostgres } from "./helpers/postgres.js";
import { ChatSession, loggedEvents, runOutcome, subscribeUntil, tokensReply } from "./helpers/session.js";
import { LOAD_QUOTAS, startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";

type Gateway = ServiceClient<(typeof GatewayService)["method"]>;
const LIVENESS_MS = 2000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let stack: Stack;
let gateway2: Gateway;
/** The session store, read as no runner: a test reads logs without loading sessions. */
let reader: PgSessionStore;
let readerPool: ReturnType<typeof openPool>;
const runners = [
  { key: "runner", id: "runner-1" },
  { key: "runner-2", id: "runner-2" },
  { key: "runner-3", id: "runner-3" },
];
const addrOf = new Map<string, string>();

before(async () => {
  const storeUrl = await (await testPostgres()).createDatabase("cluster");
  stack = await startStack({
    env: {
      ...LOAD_QUOTAS,
      TROUPE_STORE_URL: storeUrl,
      TROUPE_RUNNER_LIVENESS_MS: String(LIVENESS_MS),
      TROUPE_MIN_HEARTBEAT_S: "1",
      TROUPE_RUNNER_ID: "runner-1",
    },
  });
  readerPool = openPool(storeUrl);
  reader = new PgSessionStore(readerPool, { runnerId: "reader", address: "", incarnation: "reader" }, LIVENESS_MS);
  addrOf.set("runner", stack.addr.runner);
  for (const r of runners.slice(1))
    addrOf.set(r.key, await stack.startInstance(r.key, "runner", { args: ["--runner-id", r.id] }));
  const router2 = await stack.startInstance("router-2", "router");
  const gw2 = await stack.startInstance("gateway-2", "gateway", { args: ["--router", router2] });
  gateway2 = createClient(GatewayService, gw2, { headers: { authorization: `Bearer ${stack.apiKey}` } });
  await waitFor("three live runners", async () => (await liveRunners()).length === 3);
});
after(async () => {
  gateway2?.close();
  await readerPool?.end();
  await stack?.stop();
});

async function liveRunners() {
  const router = stack.client(RouterService, stack.addr.router);
  try {
    return (await router.listRunners({})).runners;
  } finally {
    router.close();
  }
}

/** A session id the routers place on runner `id` (rendezvous hashing over the live runners). */
async function sessionOn(id: string, prefix: string): Promise<string> {
  const live = await liveRunners();
  for (let i = 0; ; i++)
    if (placeOn(live, refKey(refOf(DEV_IDENTITY, `${prefix}-${i}`)))?.runnerId === id) return `${prefix}-${i}`;
}

const restart = async (key: string) => {
  const r = runners.find((x) => x.key === key)!;
  if (key === "runner") await stack.start("runner");
  else await stack.startInstance(key, "runner", { addr: addrOf.get(key), args: ["--runner-id", r.id] });
};

describe("a cluster on PostgreSQL", () => {
  test("a runner paused past its lease loses its sessions; awake, it serves none of them from memory", async () => {
    const sessionId = await sessionOn("runner-2", "paused");
    const first = new ChatSession(stack.gateway);
    first.open(sessionId);
    await first.waitOpened();
    await first.turn("before the pause");
    first.close();

    const proc = stack.process("runner-2")!;
    proc.kill("SIGSTOP");
    try {
      await sleep(LIVENESS_MS * 1.5);
      // Through the other gateway: the session moves to a live runner, which takes it over.
      const during = new ChatSession(gateway2);
      during.send({ case: "open", value: { sessionId, create: false, replayAfterSeq: 0n } });
      await during.waitOpened(15_000);
      await during.turn("while it sleeps");
      during.close();
    } finally {
      proc.kill("SIGCONT");
    }
    // Awake and live again, runner-2 is where the routers place the session; it must not answer
    // from the actor it held before the pause.
    await waitFor("runner-2 live again", async () => (await liveRunners()).some((r) => r.runnerId === "runner-2"));
    await sleep(LIVENESS_MS);
    // The first gateway still has the session cached at runner-2: the stream must reach the owner
    // in one go (runner-2 no longer holds an actor that would take the prompt and then fail).
    const awake = new ChatSession(stack.gateway);
    awake.send({ case: "open", value: { sessionId, create: false, replayAfterSeq: 0n } });
    await awake.waitOpened();
    await awake.turn("after it woke");
    awake.close();
    for (const gw of [stack.gateway, gateway2]) {
      const events = await subscribeUntil(gw, sessionId, 0n, 3);
      const texts = events.flatMap((e) =>
        e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT
          ? [e.payload.value.message.text]
          : [],
      );
      assert.deepEqual(texts, ["You said: before the pause", "You said: while it sleeps", "You said: after it woke"]);
    }
    const history = await stack.gateway.getHistory({ sessionId });
    assert.equal(history.messages.length, 6);
  });

  test("a rolling restart of every runner during traffic aborts no turn", { timeout: 180_000 }, async () => {
    let restarting = true;
    const client = async (i: number) => {
      const sessionId = `rolling-${i}`;
      const seen = new Map<bigint, AgentEvent>();
      let lastSeq = 0n;
      let sent = 0;
      const ends = () => [...seen.values()].filter((e) => e.payload.case === "agentEnd");
      while (restarting || sent < 4) {
        const frameId = `${sessionId}-p${sent}`;
        const s = new ChatSession(i % 2 ? gateway2 : stack.gateway);
        s.send({ case: "open", value: { sessionId, create: true, replayAfterSeq: lastSeq } });
        const collect = () => {
          for (const e of s.events)
            if (!seen.has(e.seq)) seen.set(e.seq, e), (lastSeq = e.seq > lastSeq ? e.seq : lastSeq);
        };
        try {
          await s.waitOpened(10_000);
          collect();
          const accepted = [...seen.values()].some(
            (e) => e.payload.case === "frameAccepted" && e.payload.value.frameId === frameId,
          );
          if (!accepted) s.send({ case: "prompt", value: { text: "!tokens 20 rate=40" } }, frameId);
          await s.until(() => (collect(), ends().length > sent), 20_000);
          sent++;
        } catch {
          collect();
          await sleep(150);
        } finally {
          s.close();
        }
      }
      return { sessionId, sent, events: [...seen.values()] };
    };
    const traffic = Promise.all(Array.from({ length: 12 }, (_, i) => client(i)));
    await sleep(1500);
    for (const r of runners) {
      assert.equal(await stack.kill(r.key, "SIGTERM"), 0, `${r.key} drained and exited cleanly`);
      await restart(r.key);
      await sleep(1000);
    }
    restarting = false;
    const results = await traffic;
    for (const { sessionId, sent, events } of results) {
      const ends = events.filter((e) => e.payload.case === "agentEnd");
      assert.equal(ends.length, sent, `${sessionId}: one end per prompt`);
      for (const e of ends)
        assert.equal(
          e.payload.case === "agentEnd" && e.payload.value.stopReason,
          StopReason.COMPLETED,
          `${sessionId}: every turn completed`,
        );
      assert.ok(!events.some((e) => e.payload.case === "runResumed"), `${sessionId}: no run was cut and resumed`);
      const history = await stack.gateway.getHistory({ sessionId, pageSize: 1000 });
      assert.equal(history.messages.filter((m) => m.role === Role.USER).length, sent, `${sessionId}: each prompt once`);
    }
  });

  test("a runner killed mid-run with no client watching: another runner finishes the run", async () => {
    const sessionId = await sessionOn("runner-2", "orphan");
    const ref = refOf(DEV_IDENTITY, sessionId);
    // Read straight from the database: a call through a gateway would load the session itself.
    const events = async () => loggedEvents(await reader.read(ref).catch(() => []));
    await stack.gateway.createSession({ sessionId });
    await stack.gateway.sendMessage({ sessionId, frameId: "m1", text: "!tokens 60 rate=20" });
    await waitFor("the run to start", async () => (await events()).some((e) => e.payload.case === "agentStart"));
    await sleep(500);
    await stack.kill("runner-2", "SIGKILL");
    try {
      // Its lease lapses after LIVENESS_MS; a live runner's next sweep takes the session.
      const done = await waitFor(
        "another runner to finish the run",
        async () => {
          const evs = await events();
          return evs.some((e) => e.payload.case === "agentEnd") && evs;
        },
        30_000,
      );
      assert.deepEqual(runOutcome(done), {
        resumed: true,
        stopReason: StopReason.COMPLETED,
        answers: [tokensReply(60)],
      });
    } finally {
      await restart("runner-2");
      await waitFor("three live runners", async () => (await liveRunners()).length === 3);
    }
  });

  test("a tool call held for approval outlives its runner: another runner holds the wait and runs the call once", async () => {
    await writeAgent(stack.dataDir, "guarded", { approvals: { tools: { exec: "ask" } } });
    const sessionId = await sessionOn("runner-2", "held");
    const ref = refOf(DEV_IDENTITY, sessionId);
    const events = async () => loggedEvents(await reader.read(ref).catch(() => []));
    await stack.gateway.createSession({ sessionId, agentId: "guarded" });
    await stack.gateway.sendMessage({ sessionId, frameId: "m1", text: "$ echo held-once" });
    const asked = await waitFor("the run to wait", async () => {
      const evs = await events();
      return (
        evs.some((e) => e.payload.case === "runWaiting") && evs.find((e) => e.payload.case === "toolApprovalRequested")
      );
    });
    const callId = asked.payload.case === "toolApprovalRequested" ? asked.payload.value.toolCallId : "";
    await stack.kill("runner-2", "SIGKILL");
    try {
      // Past the dead runner's lease, a live runner adopts the session and holds the wait.
      await waitFor(
        "another runner to hold the wait",
        async () => {
          const listed = await gateway2.listSessions({}).catch(() => undefined);
          return listed?.sessions.find((x) => x.sessionId === sessionId)?.pending[0]?.toolCallId === callId;
        },
        30_000,
      );
      await gateway2.decideToolCall({ sessionId, frameId: "d1", toolCallId: callId, verdict: ToolVerdict.APPROVE });
      const done = await waitFor(
        "the approved call to run and the run to end",
        async () => {
          const evs = await events();
          return evs.some((e) => e.payload.case === "agentEnd") && evs;
        },
        30_000,
      );
      assert.equal(done.filter((e) => e.payload.case === "toolApprovalRequested").length, 1, "asked once");
      assert.equal(done.filter((e) => e.payload.case === "toolExecutionStart").length, 1, "run once");
      const end = done.find((e) => e.payload.case === "agentEnd");
      assert.equal(end?.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
      const result = done.find((e) => e.payload.case === "toolExecutionEnd");
      assert.match(result?.payload.case === "toolExecutionEnd" ? result.payload.value.result : "", /held-once/);
    } finally {
      await restart("runner-2");
      await waitFor("three live runners", async () => (await liveRunners()).length === 3);
    }
  });

  test("a schedule fires once per due time across three runners", async () => {
    const sessionId = "scheduled";
    const s = new ChatSession(stack.gateway);
    s.open(sessionId);
    await s.waitOpened();
    s.close();
    const started = Date.now();
    await stack.gateway.createSchedule({
      schedule: { sessionId, scheduleId: "tick", when: { case: "everySeconds", value: 1 }, text: "tick" },
    });
    await sleep(6000);
    await gateway2.deleteSchedule({ sessionId, scheduleId: "tick" });
    const elapsed = (Date.now() - started) / 1000;
    await sleep(1500);
    const fired = (await stack.gateway.getHistory({ sessionId, pageSize: 1000 })).messages
      .filter((m) => m.role === Role.USER)
      .map((m) => m.frameId);
    assert.equal(new Set(fired).size, fired.length, "no due time fired twice");
    assert.ok(
      fired.length >= 3 && fired.length <= Math.ceil(elapsed) + 1,
      `${fired.length} firings in ${elapsed.toFixed(1)} s of a 1 s schedule`,
    );
  });

  test("DeleteSession through another gateway takes the session's sub-agent sessions with it", async () => {
    const s = new ChatSession(stack.gateway);
    s.open("family");
    await s.waitOpened();
    const events = await s.turn(`!call delegate_task ${JSON.stringify({ task: "hello child" })}`, 30_000);
    s.close();
    const child = /sub-agent session (\S+) started/.exec(
      events.flatMap((e) => (e.payload.case === "toolExecutionUpdate" ? [e.payload.value.output] : [])).join(""),
    )?.[1];
    assert.ok(child, "a child was started");
    assert.equal(await reader.exists(refOf(DEV_IDENTITY, child)), true);
    await gateway2.deleteSession({ sessionId: "family" });
    for (const id of ["family", child]) {
      assert.equal(await reader.exists(refOf(DEV_IDENTITY, id)), false, `${id} is gone from the store`);
      await assert.rejects(stack.gateway.getHistory({ sessionId: id }), (e: { code?: number }) => e.code === 5);
    }
  });
});
