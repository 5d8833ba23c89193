// A run its runner died in goes on when the session loads again (RunResumed): finished tool calls
// keep their logged results and are not run again, a call left running is answered as interrupted,
// and the model is asked again from the last complete step, under the same turn.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import {
  ChatMessageSchema,
  ClientFrameSchema,
  Role,
  StopReason,
} from "../../services/shared/gen/troupe/v1/session_pb.js";
import type { QueuedMessage } from "../../services/runner/loop/run.js";
import { cutRunOf, replayRecords, type ReplayedLog } from "../../services/runner/session/recovery.js";
import { SessionActor } from "../../services/runner/session/session-actor.js";
import type { Tool } from "../../services/runner/tools/tools.js";
import { Collector, ScriptedModel, call, echoTool, newActor, prompt, say, testRunDeps } from "../helpers/in-process.js";

const message = (role: Role, over: object = {}) => create(ChatMessageSchema, { role, ...over });
const log = (messages: ReturnType<typeof message>[], openTurnFrom = 0): ReplayedLog => ({
  ...replayRecords([]),
  openTurn: "t1",
  openTurnFrom,
  messages,
});

describe("what a cut-off run becomes", () => {
  test("resumed when its messages are in the log and it had not answered", () => {
    const asked = message(Role.ASSISTANT, { toolCalls: [{ id: "c1", name: "exec", argumentsJson: "{}" }] });
    assert.deepEqual(cutRunOf(log([message(Role.USER), message(Role.USER), asked], 1)), {
      resume: true,
      from: 1,
      interrupted: [],
    });
  });

  test("closed as it ended when its final answer is in the log: asking again would answer twice", () => {
    const answered = message(Role.ASSISTANT, { text: "done", stopReason: StopReason.LENGTH });
    assert.deepEqual(cutRunOf(log([message(Role.USER), answered])), { resume: false, ended: StopReason.LENGTH });
  });

  test("neither when none of its messages reached the log (its frames run again from the queue)", () => {
    assert.equal(cutRunOf(log([message(Role.USER)], 1)), undefined);
    assert.equal(cutRunOf({ ...log([message(Role.USER)]), openTurn: undefined }), undefined);
  });
});

/** A tool that never finishes: the runner "dies" while it runs. */
function hangingTool(started: string[]): Tool {
  return {
    name: "deploy",
    description: "deploys (never finishes here)",
    parameters: { type: "object", properties: { text: { type: "string" } } },
    execute: (args) => {
      started.push(String(args.text));
      return new Promise(() => undefined);
    },
  };
}

describe("a session loaded after its runner died mid-run", () => {
  test("goes on from the last complete step: no finished call runs again, the running one is interrupted", async () => {
    const ran: string[] = [];
    const deploys: string[] = [];
    const model = new ScriptedModel((r) =>
      r.messages.some((m) => m.role === "tool" && m.content.startsWith("Interrupted"))
        ? say("resumed and finished")
        : call(["echo", { text: "built" }], ["deploy", { text: "v2" }]),
    );
    const tools = [echoTool("echo", 0, ran), hangingTool(deploys)];
    const { actor, events, store, deps } = await newActor(() => testRunDeps(model, tools));
    await actor.submit(prompt("build and deploy"));
    await events.waitFor((e) => e.payload.case === "toolExecutionStart" && e.payload.value.toolName === "deploy");
    // Events reach subscribers before the log's group commit: wait until echo's result is durable.
    while (!store.records(actor.ref).some((r) => JSON.stringify(r).includes("ROLE_TOOL")))
      await new Promise((r) => setTimeout(r, 5));
    const turnId =
      events.of("agentStart").length === 1 ? events.events.find((e) => e.payload.case === "agentStart")!.turnId : "";
    // The process dies here: nothing closes the actor. Another activation loads the log.
    const again = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await again.attach(later);
    const end = await later.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(end.turnId, turnId, "the same turn goes on");
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
    const resumed = later.of("runResumed");
    assert.equal(resumed.length, 1);
    assert.equal(later.of("agentStart").length, 0, "run_resumed stands where agent_start would");
    const deployCall = again.history.messages.flatMap((m) => m.toolCalls).find((c) => c.name === "deploy")!;
    assert.deepEqual(resumed[0].interruptedToolCallIds, [deployCall.id]);
    assert.deepEqual(ran, ["built"], "the finished call was not run again");
    assert.deepEqual(deploys, ["v2"], "the interrupted call was not run again blindly");
    // The model was asked again with the whole step: the logged result and the interruption.
    const last = model.requests.at(-1)!.messages;
    assert.ok(last.some((m) => m.role === "tool" && m.content === "echo: built"));
    assert.equal(again.history.messages.filter((m) => m.role === Role.ASSISTANT).at(-1)?.text, "resumed and finished");
    assert.deepEqual(
      again.history.messages.filter((m) => m.role === Role.USER).map((m) => m.text),
      ["build and deploy"],
      "the prompt is in the history once",
    );
  });

  test("a call that never started (behind the one running) runs after the restart; only the running one is interrupted", async () => {
    const ran: string[] = [];
    const deploys: string[] = [];
    const model = new ScriptedModel((r) =>
      r.messages.some((m) => m.role === "tool" && m.content.startsWith("Interrupted"))
        ? say("finished")
        : call(["deploy", { text: "v3" }], ["echo", { text: "notify" }]),
    );
    const { actor, events, store, deps } = await newActor(() =>
      testRunDeps(model, [echoTool("echo", 0, ran), hangingTool(deploys)]),
    );
    await actor.submit(prompt("deploy, then notify"));
    await events.waitFor((e) => e.payload.case === "toolExecutionStart" && e.payload.value.toolName === "deploy");
    while (!store.records(actor.ref).some((r) => JSON.stringify(r).includes("toolExecutionStart")))
      await new Promise((r) => setTimeout(r, 5));
    const again = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await again.attach(later);
    await later.waitFor((e) => e.payload.case === "agentEnd");
    const deployCall = again.history.messages.flatMap((m) => m.toolCalls).find((c) => c.name === "deploy")!;
    assert.deepEqual(later.of("runResumed")[0].interruptedToolCallIds, [deployCall.id]);
    assert.deepEqual(ran, ["notify"], "the call that never started ran once, after the restart");
    assert.deepEqual(deploys, ["v3"]);
  });

  test("a resumed run speaks for the person whose message it had taken, not the session's first speaker", async () => {
    const speakers: (string | undefined)[] = [];
    const model = new ScriptedModel((r) =>
      r.messages.some((m) => m.role === "tool" && m.content.startsWith("Interrupted"))
        ? say("ok")
        : call(["deploy", {}]),
    );
    const runDeps = (_: SessionActor, first: readonly QueuedMessage[]) => {
      speakers.push(first[0]?.speaker?.id);
      return testRunDeps(model, [hangingTool([])]);
    };
    const { actor, events, store, deps } = await newActor(runDeps);
    const spoken = create(ClientFrameSchema, {
      frameId: "g1",
      speaker: { id: "telegram:7", displayName: "Ann" },
      kind: { case: "prompt", value: { text: "deploy it" } },
    });
    await actor.submit(spoken);
    await events.waitFor((e) => e.payload.case === "toolExecutionStart");
    while (!store.records(actor.ref).some((r) => JSON.stringify(r).includes("toolCalls")))
      await new Promise((r) => setTimeout(r, 5));
    const again = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await again.attach(later);
    await later.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(speakers, ["telegram:7", "telegram:7"]);
  });

  test("a run whose answer was logged before agent_end is closed, not asked again", async () => {
    let calls = 0;
    const model = new ScriptedModel(() => (calls++, say("the answer")));
    const { actor, events, store, deps } = await newActor(() => testRunDeps(model));
    await actor.submit(prompt("q"));
    await actor.whenIdle();
    // As if the runner died between the answer's message_end and agent_end.
    store.dropLast(actor.ref, (r) => r.t === "event" && (r.event as { agentEnd?: unknown }).agentEnd !== undefined);
    const again = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await again.attach(later);
    await again.whenIdle();
    assert.equal(calls, 1);
    assert.equal(events.of("agentEnd").length, 1);
    assert.deepEqual(
      again.history.messages.filter((m) => m.role === Role.ASSISTANT).map((m) => m.text),
      ["the answer"],
    );
  });
});

describe("a runner shutting down (SIGTERM)", () => {
  test("a run that finishes within the grace ends normally; no new run starts meanwhile", async () => {
    const model = new ScriptedModel((r) => say(`answer to ${r.messages.at(-1)?.role === "user" ? "q" : "?"}`, 5));
    const { actor, events } = await newActor(() => testRunDeps(model));
    await actor.submit(prompt("q"));
    await events.waitFor((e) => e.payload.case === "agentStart");
    const drained = actor.drain();
    await actor.submit(prompt("queued during the drain"));
    await drained;
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.COMPLETED);
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(events.of("agentStart").length, 1, "the queued prompt waits for the next runner");
    await actor.close({ handOver: true });
  });

  test("a run still going after the grace is handed over, not ended, and the next load resumes it", async () => {
    let release = () => undefined as void;
    const gate = new Promise<void>((r) => (release = r));
    const model = new ScriptedModel((_, i) => (i === 0 ? call(["wait", {}]) : say("finished elsewhere")));
    const wait: Tool = {
      name: "wait",
      description: "waits",
      parameters: { type: "object" },
      execute: (_, ctx) =>
        new Promise((resolve) => {
          gate.then(() => resolve({ output: "waited", isError: false }));
          ctx.signal.addEventListener("abort", () => resolve({ output: "aborted", isError: true }), { once: true });
        }),
    };
    const { actor, events, store, deps } = await newActor(() => testRunDeps(model, [wait]));
    await actor.submit(prompt("long job"));
    await events.waitFor((e) => e.payload.case === "toolExecutionStart");
    await Promise.race([actor.drain(), new Promise((r) => setTimeout(r, 20))]);
    await actor.close({ handOver: true });
    release();
    const logged = store.records(actor.ref).map((r) => JSON.stringify(r));
    assert.ok(!logged.some((r) => r.includes("agentEnd")), "the handed-over run has no end in the log");
    const again = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await again.attach(later);
    const end = await later.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
    assert.equal(later.of("runResumed").length, 1);
    assert.equal(again.history.messages.at(-1)?.text, "finished elsewhere");
  });
});
