// The session actor in-process: the in-memory store, a scripted model client, no ports. Every
// queue mode, dedupe, seq reservation, supervision and restart, a failing log, and the tenant's
// quota of runs.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { toJson } from "@bufbuild/protobuf";
import { ClientFrameSchema, QueueMode, Role, StopReason } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../../services/shared/errors.js";
import { TenantQuotas, DEFAULT_QUOTAS } from "../../services/shared/auth/quotas.js";
import { RETRY_AFTER_KEY } from "../../services/shared/auth/rate.js";
import { SessionActor } from "../../services/runner/session/session-actor.js";
import { settledLog } from "../../services/runner/session/session-log.js";
import { TenantRuns } from "../../services/runner/session/tenant-runs.js";
import { refOf } from "../../services/shared/session-ref.js";
import { SUMMARY_MARKER } from "../../services/runner/loop/run.js";
import {
  Collector,
  ScriptedModel,
  call,
  echoTool,
  frame,
  lastUser,
  newActor,
  prompt,
  say,
  testRunDeps,
} from "../helpers/in-process.js";

const answers = (actor: SessionActor) =>
  actor.history.messages.filter((m) => m.role === Role.ASSISTANT).map((m) => m.text);
const users = (actor: SessionActor) => actor.history.messages.filter((m) => m.role === Role.USER).map((m) => m.text);

describe("a prompt", () => {
  test("is acknowledged only once it is in the log, then runs and is answered", async () => {
    const model = new ScriptedModel((r) => say(`You said: ${lastUser(r)}`));
    const { actor, events, store } = await newActor(() => testRunDeps(model));
    const ack = await actor.submit(prompt("hello", "p1"));
    assert.equal(ack.payload.case, "frameAccepted");
    const logged = store.records(actor.ref).filter((r) => r.t === "frame");
    assert.equal(logged.length, 1, "the frame was in the log when it was acknowledged");
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(
      events.of("agentEnd").map((e) => e.stopReason),
      [StopReason.COMPLETED],
    );
    assert.deepEqual(users(actor), ["hello"]);
    assert.deepEqual(answers(actor), ["You said: hello"]);
    // seq rises by exactly one per event
    assert.deepEqual(
      events.events.map((e) => Number(e.seq)),
      events.events.map((_, i) => i + 1),
    );
  });

  test("sent twice under one frame id is acknowledged twice and run once", async () => {
    const model = new ScriptedModel(() => say("ok"));
    const { actor, events } = await newActor(() => testRunDeps(model));
    const [a, b] = await Promise.all([actor.submit(prompt("once", "same")), actor.submit(prompt("once", "same"))]);
    assert.equal(a.payload.case === "frameAccepted" && a.payload.value.duplicate, false);
    assert.equal(b.payload.case === "frameAccepted" && b.payload.value.duplicate, true);
    await actor.whenIdle();
    assert.equal(model.requests.length, 1);
    assert.deepEqual(users(actor), ["once"]);
    assert.equal(events.of("agentEnd").length, 1);
  });
});

describe("queue modes: a prompt that arrives during a run", () => {
  /** A model whose first call asks for two slow tool calls in turn; later calls answer what they got. */
  const setup = async (mode?: QueueMode) => {
    const ran: string[] = [];
    const model = new ScriptedModel((r, n) =>
      n === 0 ? call(["slow", { text: "a" }], ["slow", { text: "b" }]) : say(`answer ${n}: ${lastUser(r)}`, 0),
    );
    const made = await newActor(() => testRunDeps(model, [echoTool("slow", 300, ran)]));
    if (mode !== undefined) await made.actor.settle({ queueMode: mode });
    await made.actor.submit(prompt("start"));
    await made.events.waitFor((e) => e.payload.case === "toolExecutionStart");
    return { ...made, model, ran };
  };

  test("steer (the default): unstarted calls of the batch are skipped; the message goes in before the next model call", async () => {
    const { actor, events, ran } = await setup();
    await actor.submit(prompt("change of plan"));
    await actor.whenIdle();
    assert.deepEqual(ran, ["a"], "b was never run");
    assert.equal(events.of("toolCallsSkipped").length, 1);
    assert.equal(events.of("agentEnd").length, 1, "one run");
    assert.deepEqual(users(actor), ["start", "change of plan"]);
  });

  test("followup: runs as its own run after the current one", async () => {
    const { actor, events, ran } = await setup(QueueMode.FOLLOWUP);
    await actor.submit(prompt("afterwards"));
    await actor.whenIdle();
    assert.deepEqual(ran, ["a", "b"]);
    assert.equal(events.of("agentEnd").length, 2);
    assert.match(answers(actor).at(-1)!, /afterwards/);
  });

  test("collect: prompts within the quiet window run together as one run", async () => {
    const seen: string[][] = [];
    const model = new ScriptedModel((r, n) => {
      seen.push(r.messages.filter((m) => m.role === "user").map((m) => ("content" in m ? m.content : "")));
      return say(`answer ${n}`, n === 0 ? 100 : 0);
    });
    const { actor, events } = await newActor(() => testRunDeps(model));
    await actor.settle({ queueMode: QueueMode.COLLECT });
    await actor.submit(prompt("first"));
    await events.waitFor((e) => e.payload.case === "turnStart");
    for (const text of ["one", "two", "three"]) await actor.submit(prompt(text));
    await actor.whenIdle();
    assert.equal(events.of("agentEnd").length, 2, "the three gathered prompts ran as one run");
    assert.deepEqual(seen.at(-1), ["first", "one", "two", "three"], "each message kept whole");
  });

  test("interrupt: the running run is aborted (its calls paired), then this prompt runs", async () => {
    const { actor, events, ran } = await setup(QueueMode.INTERRUPT);
    await actor.submit(prompt("stop that, do this"));
    await actor.whenIdle();
    assert.deepEqual(
      events.of("agentEnd").map((e) => e.stopReason),
      [StopReason.ABORTED, StopReason.COMPLETED],
    );
    assert.ok(!ran.includes("b"));
    const calls = actor.history.messages.flatMap((m) => m.toolCalls.map((c) => c.id));
    const results = actor.history.messages.filter((m) => m.role === Role.TOOL).map((m) => m.toolCallId);
    assert.deepEqual(results.sort(), calls.sort(), "every call has its result");
  });

  test("reject: refused with FAILED_PRECONDITION, and nothing is recorded", async () => {
    const { actor, store } = await setup(QueueMode.REJECT);
    const before = store.records(actor.ref).length;
    await assert.rejects(actor.submit(prompt("not now")), { code: Status.FAILED_PRECONDITION });
    assert.equal(
      store.records(actor.ref).filter((r) => r.t === "frame").length,
      store
        .records(actor.ref)
        .slice(0, before)
        .filter((r) => r.t === "frame").length,
    );
    await actor.whenIdle();
  });
});

describe("seqs, supervision and the log", () => {
  test("seqs are reserved before clients see them: a reload numbers past every seq handed out", async () => {
    const model = new ScriptedModel(() => say("one two three four five"));
    const { actor, events, store, deps } = await newActor(() => testRunDeps(model));
    await actor.submit(prompt("go"));
    await actor.whenIdle();
    const lastSeen = Number(events.events.at(-1)!.seq);
    assert.ok(
      store.records(actor.ref).some((r) => r.t === "seq" && r.upTo >= lastSeen),
      "the reservation covers what was sent",
    );
    // The process dies without closing (no "closed" record): a new activation loads the log.
    const again = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await again.attach(later);
    await again.submit(prompt("again"));
    await again.whenIdle();
    assert.ok(Number(later.events[0].seq) > lastSeen, `resumed at ${later.events[0].seq}, past ${lastSeen}`);
    assert.deepEqual(users(again), ["go", "again"]);
  });

  test("a session that owes nothing says so in its log, once; a prompt after it owes again", async () => {
    const model = new ScriptedModel(() => say("done"));
    const { actor, store, deps } = await newActor(() => testRunDeps(model));
    const settledCount = () => store.records(actor.ref).filter((r) => r.t === "settled").length;
    const written = () => new Promise((r) => setTimeout(r, 20));
    await actor.submit(prompt("one"));
    await actor.whenIdle();
    await written();
    assert.ok(settledLog(store.records(actor.ref)), "settled after its run");
    const once = settledCount();
    // As if the runner died just after taking a prompt: its frame follows the settled record.
    await actor.close({ handOver: true });
    const { log } = await store.activate(actor.ref);
    await log.append({ t: "frame", frame: toJson(ClientFrameSchema, prompt("queued", "q1")) }, true);
    await log.close();
    assert.equal(settledLog(store.records(actor.ref)), false, "a prompt taken and not run is owed");
    const again = await SessionActor.load(actor.ref, deps);
    await again.whenIdle();
    await written();
    assert.deepEqual(users(again), ["one", "queued"]);
    assert.ok(settledLog(store.records(actor.ref)));
    assert.equal(settledCount(), once + 1, "one settled record a quiet spell");
    // Loaded from a settled log with nothing to do, it writes no other.
    await again.close({ handOver: true });
    const third = await SessionActor.load(actor.ref, deps);
    await third.whenIdle();
    await written();
    assert.equal(settledCount(), once + 1);
  });

  test("the session's model and queue mode are kept in its log, and a reload runs on them", async () => {
    const asked: string[] = [];
    const model = new ScriptedModel((r) => {
      asked.push(r.model);
      return say("ok");
    });
    const { actor, store, deps } = await newActor(() => testRunDeps(model, [], { config: { models: ["m2"] } }));
    await actor.settle({ queueMode: QueueMode.FOLLOWUP, model: "m2" });
    await actor.settle({ model: "m2" });
    assert.equal(
      store.records(actor.ref).filter((r) => r.t === "settings").length,
      1,
      "an unchanged setting is not written again",
    );
    const again = await SessionActor.load(actor.ref, deps);
    assert.equal(again.choices.model, "m2");
    await again.submit(prompt("go"));
    await again.whenIdle();
    assert.deepEqual(asked, ["m2"]);

    // A reasoning effort and a reset are kept the same way, and survive a reload.
    await again.settle({ reasoningEffort: "high", reset: true });
    const third = await SessionActor.load(actor.ref, deps);
    assert.equal(third.choices.reasoningEffort, "high");
    assert.equal(third.choices.contextFrom, again.history.length, "the model's view starts after the reset");
    await third.settle({ reasoningEffort: "default" });
    assert.equal((await SessionActor.load(actor.ref, deps)).choices.reasoningEffort, "", "default: the agent's again");
  });

  test("a run that throws (a bug) restarts the actor from its log; the session goes on; five in a minute fail it", async () => {
    let fail = 1;
    const model = new ScriptedModel(() => say("fine"));
    const deps = testRunDeps(model, [], {
      systemPrompt: async () => {
        if (fail-- > 0) throw new Error("a bug in the prompt builder");
        return { text: "sys", tokens: 1, warnings: [] };
      },
    });
    const { actor, events } = await newActor(() => deps);
    await actor.submit(prompt("boom"));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.ERROR);
    await actor.whenIdle();
    await actor.submit(prompt("after"));
    await events.waitFor((e) => e.payload.case === "agentEnd" && e.payload.value.stopReason === StopReason.COMPLETED);
    assert.deepEqual(answers(actor), ["fine"]);
    // Five failures within 60 s (the first, and four more): the session is failed, later frames are refused.
    fail = 4;
    for (let i = 0; i < 4; i++) {
      const from = events.events.length;
      await actor.submit(prompt(`crash ${i}`));
      await events.waitFor((e) => e.payload.case === "agentEnd", from, 5000);
      await actor.whenIdle();
    }
    await events.waitFor((e) => e.payload.case === "error" && e.payload.value.code === "SESSION_FAILED", 0, 5000);
    await assert.rejects(actor.submit(prompt("anyone?")), { code: Status.FAILED_PRECONDITION });
  });

  test("a log write that fails refuses the frame (UNAVAILABLE); the next activation has all that was acknowledged", async () => {
    const model = new ScriptedModel(() => say("ok"));
    const { actor, store, deps } = await newActor(() => testRunDeps(model));
    await actor.submit(prompt("kept"));
    await actor.whenIdle();
    store.failAppends(1);
    await assert.rejects(actor.submit(prompt("lost")), { code: Status.UNAVAILABLE });
    await assert.rejects(
      actor.submit(prompt("also refused")),
      { code: Status.UNAVAILABLE },
      "the actor has left: nothing past the hole",
    );
    const again = await SessionActor.load(refOf(actor.owner, actor.sessionId), deps);
    await again.submit(prompt("resent"));
    await again.whenIdle();
    assert.deepEqual(users(again), ["kept", "resent"]);
  });

  test("a settings write that fails is refused (UNAVAILABLE) and the session leaves; a reload has the logged settings", async () => {
    const model = new ScriptedModel(() => say("ok"));
    const { actor, store, deps } = await newActor(() => testRunDeps(model, [], { config: { models: ["m2"] } }));
    store.failAppends(1);
    await assert.rejects(actor.settle({ model: "m2", queueMode: QueueMode.FOLLOWUP }), { code: Status.UNAVAILABLE });
    await assert.rejects(
      actor.submit(prompt("after")),
      { code: Status.UNAVAILABLE },
      "the actor has left: it would run on settings its log does not have",
    );
    const again = await SessionActor.load(actor.ref, deps);
    assert.equal(again.choices.model, "", "the log never had m2");
    assert.notEqual(again.queueMode, QueueMode.FOLLOWUP);
  });
});

describe("what an actor holds", () => {
  /** Answers summaries by rule, everything else with the same short text, 7 tokens in and 3 out each. */
  const model = () =>
    new ScriptedModel((r) => {
      const system = r.messages[0] && "content" in r.messages[0] ? String(r.messages[0].content) : "";
      const reply = say(system.includes(SUMMARY_MARKER) ? "## Goal\nsummed up" : "noted, go on");
      if (reply instanceof Error) return reply;
      const end = reply.chunks.at(-1)!;
      if (end.type === "done") end.usage = { inputTokens: 7, outputTokens: 3, cacheReadInputTokens: 0 };
      return reply;
    });
  // A window a dozen messages fill: compaction comes every few turns.
  const small = { config: { contextWindow: 420, reserveTokens: 100, maxOutputTokens: 64, keepRecentTokens: 60 } };
  const filler = "with words enough to fill the small window of this session in a few turns";

  test("after a compaction only what the model still sees is held; the history is whole through the log", async () => {
    const scripted = model();
    const { actor, events, deps } = await newActor(() => testRunDeps(scripted, [], small));
    for (let i = 0; i < 24; i++) {
      await actor.submit(prompt(`message ${i} ${filler}`));
      await actor.whenIdle();
    }
    assert.ok(events.of("compactionEnd").length >= 2, `compactions: ${events.of("compactionEnd").length}`);
    const total = actor.history.length;
    assert.equal(total, 48, "a user message and an answer per turn");
    assert.equal(actor.info().messageCount, total);
    assert.ok(actor.history.messages.length < 16, `held ${actor.history.messages.length} of ${total}`);
    // The held part starts at the latest cut: the model's view loses nothing by it.
    const cut = events.of("compactionEnd").at(-1)!.firstKeptMessageId;
    assert.equal(actor.history.messages[0].id, cut);
    // Every message, in order, whether held or read back from the log, which is read once for all
    // the pages; the usage of every reply.
    let reads = 0;
    const read = deps.store.read.bind(deps.store);
    deps.store.read = (ref) => (reads++, read(ref));
    const whole = [];
    for (let offset = 0; offset < total; offset += 5) whole.push(...(await actor.historyPage(offset, 5)));
    assert.equal(reads, 1);
    assert.deepEqual(
      whole.filter((m) => m.role === Role.USER).map((m) => m.text.split(" ").slice(0, 2).join(" ")),
      Array.from({ length: 24 }, (_, i) => `message ${i}`),
    );
    assert.deepEqual(whole.slice(-actor.history.messages.length), actor.history.messages);
    assert.equal(actor.history.usage().inputTokens, 7 * 24);
    assert.equal(actor.history.usage().outputTokens, 3 * 24);

    // A reload holds the same part, and the model's next view is the summary and that part.
    const held = actor.history.messages.map((m) => m.text);
    const again = await SessionActor.load(actor.ref, deps);
    assert.deepEqual(
      again.history.messages.map((m) => m.id),
      actor.history.messages.map((m) => m.id),
    );
    await again.submit(prompt("next"));
    await again.whenIdle();
    const request = scripted.requests.at(-1)!.messages.map((m) => ("content" in m ? String(m.content) : ""));
    assert.match(request[1], /<summary>\n## Goal\nsummed up/);
    assert.deepEqual(request.slice(2), [...held, "next"]);
  });

  test("a reset lets go of everything before it, and an earlier summary does not come back", async () => {
    const scripted = model();
    const { actor, events } = await newActor(() => testRunDeps(scripted, [], small));
    for (let i = 0; i < 10; i++) {
      await actor.submit(prompt(`message ${i} ${filler}`));
      await actor.whenIdle();
    }
    assert.ok(events.of("compactionEnd").length >= 1);
    await actor.settle({ reset: true });
    await actor.submit(prompt("a fresh start"));
    await actor.whenIdle();
    const request = scripted.requests.at(-1)!;
    assert.ok(!JSON.stringify(request.messages).includes("summed up"), "no summary after a reset");
    assert.deepEqual(
      actor.history.messages.map((m) => m.text),
      ["a fresh start", "noted, go on"],
    );
    assert.equal(actor.history.length, 22);
  });
});

describe("the tenant's quota of runs", () => {
  test("a message that would start a run in an idle session waits for the quota; its own run's messages do not", async () => {
    const quotas = new TenantQuotas({ ...DEFAULT_QUOTAS, concurrentRuns: 1 });
    const runs = new TenantRuns(quotas);
    const model = new ScriptedModel(() => say("slow answer here", 60));
    const a = await newActor(() => testRunDeps(model), { deps: { runs }, sessionId: "a" });
    const b = await newActor(() => testRunDeps(model), { deps: { runs }, sessionId: "b", store: a.store });
    await a.actor.submit(prompt("long"));
    await assert.rejects(
      b.actor.submit(prompt("me too")),
      (err: { code: number; trailers: Record<string, string> }) =>
        err.code === Status.RESOURCE_EXHAUSTED && Number(err.trailers[RETRY_AFTER_KEY]) > 0,
    );
    await a.actor.submit(frame({ case: "followUp", value: { text: "and more" } }));
    await a.actor.whenIdle();
    assert.equal(runs.count("t"), 0);
    await b.actor.submit(prompt("now"));
    await b.actor.whenIdle();
    assert.deepEqual(users(b.actor), ["now"]);
  });
});

describe("supervision", () => {
  test("frames accepted during a restart run one at a time after it, never beside the failed run", async () => {
    let fail = 1;
    const model = new ScriptedModel(() => say("steady on", 20));
    let going = 0;
    let most = 0;
    const runs = new (class extends TenantRuns {
      override started(tenant: string): void {
        super.started(tenant);
        most = Math.max(most, ++going);
      }
      override ended(tenant: string): void {
        super.ended(tenant);
        going--;
      }
    })(new TenantQuotas(DEFAULT_QUOTAS));
    const deps = testRunDeps(model, [], {
      systemPrompt: async () => {
        if (fail-- > 0) throw new Error("a bug in the prompt builder");
        return { text: "sys", tokens: 1, warnings: [] };
      },
    });
    const { actor, events } = await newActor(() => deps, { deps: { runs } });
    await actor.submit(prompt("boom"));
    await events.waitFor((e) => e.payload.case === "error" && e.payload.value.code === "INTERNAL");
    // The restart waits out its backoff (100 ms); these are admitted once it has rebuilt.
    const late = ["a", "b", "c"].map((t) => actor.submit(prompt(t)));
    await Promise.all(late);
    await actor.whenIdle();
    assert.equal(most, 1, "one run at a time");
    assert.equal(going, 0);
    assert.deepEqual(users(actor), ["boom", "a", "b", "c"]);
    assert.equal(answers(actor).at(-1), "steady on", "what came in last was answered");
  });

  test("until the failed run has ended, the restart keeps it as the session's run", async () => {
    const model = new ScriptedModel(() => say("fine"));
    const deps = testRunDeps(model, [], {
      systemPrompt: async () => {
        throw new Error("a bug in the prompt builder");
      },
    });
    const { actor, events } = await newActor(() => deps);
    for (let i = 0; i < 5; i++) {
      const from = events.events.length;
      await actor.submit(prompt(`crash ${i}`));
      await events.waitFor((e) => e.payload.case === "agentEnd", from, 5000);
      await actor.whenIdle();
    }
    const failed = await events.waitFor((e) => e.payload.case === "error" && e.payload.value.code === "SESSION_FAILED");
    const internal = events.events.filter((e) => e.payload.case === "error" && e.payload.value.code === "INTERNAL");
    assert.equal(internal.length, 5);
    // Emitted after the rebuild closed the cut-off run: with no run recorded then, it had no turn.
    assert.equal(failed.turnId, internal[4].turnId, "the failure belongs to the run that spent the budget");
    assert.notEqual(failed.turnId, "");
    assert.equal(actor.running, false);
  });
});
