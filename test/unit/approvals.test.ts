// Tool calls that wait for a person: the approval policy's rules, and a session actor in-process
// (in-memory store, scripted model) that holds a call, waits, takes decisions, survives a reload
// from its log, and ends a wait by timeout, abort or steering.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { QueueMode, Role, StopReason, ToolVerdict } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../../services/shared/errors.js";
import { approvalOf, type ApprovalPolicy } from "../../services/runner/tools/approvals.js";
import { parseAgentConfig, AgentConfigError } from "../../services/runner/agent-config.js";
import { SessionActor } from "../../services/runner/session/session-actor.js";
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
import type { RpcError } from "../../services/shared/errors.js";

describe("the approval policy", () => {
  const policy: ApprovalPolicy = {
    tools: {
      exec: { mode: "ask", allowArguments: { command: ["ls( .*)?", "cat [^;|&]*"] } },
      web_fetch: { mode: "ask", allowHosts: { url: ["docs.python.org", "*.github.com"] } },
      delete_memory: "deny",
      "*": "allow",
    },
    timeoutSeconds: 60,
    tenants: { acme: { tools: { read_file: "ask" }, onTimeout: "abort" } },
  };

  test("argument patterns match in full; anything else asks", () => {
    assert.equal(approvalOf(policy, "t", "exec", { command: "ls -la" }).mode, "allow");
    assert.equal(approvalOf(policy, "t", "exec", { command: "cat notes.txt" }).mode, "allow");
    const chained = approvalOf(policy, "t", "exec", { command: "cat a; rm -rf /" });
    assert.equal(chained.mode, "ask");
    assert.match(chained.rule, /the agent's rule for exec: ask \(the arguments match no allowed pattern\)/);
    assert.equal(approvalOf(policy, "t", "exec", { command: "xls" }).mode, "ask", "a pattern is anchored");
    assert.equal(approvalOf(policy, "t", "exec", {}).mode, "ask", "a missing argument matches nothing");
  });

  test("hosts: listed ones pass, others ask, *.x is any name under x", () => {
    assert.equal(approvalOf(policy, "t", "web_fetch", { url: "https://docs.python.org/3/" }).mode, "allow");
    assert.equal(approvalOf(policy, "t", "web_fetch", { url: "https://api.github.com/x" }).mode, "allow");
    assert.equal(approvalOf(policy, "t", "web_fetch", { url: "https://github.com.evil.example/" }).mode, "ask");
    assert.equal(approvalOf(policy, "t", "web_fetch", { url: "file:///etc/passwd" }).mode, "ask");
  });

  test("deny, the * default, no policy at all, and a tenant's override", () => {
    assert.equal(approvalOf(policy, "t", "delete_memory", {}).mode, "deny");
    assert.equal(approvalOf(policy, "t", "read_file", {}).mode, "allow");
    assert.equal(approvalOf(undefined, "t", "exec", {}).mode, "allow");
    const acme = approvalOf(policy, "acme", "read_file", {});
    assert.equal(acme.mode, "ask");
    assert.match(acme.rule, /tenant acme's rule for read_file/);
    assert.equal(acme.onTimeout, "abort");
    assert.equal(acme.timeoutMs, 60_000, "what the tenant leaves out is the agent's");
  });

  test("agent.json: a pattern that does not compile is refused with where it is", () => {
    assert.throws(
      () =>
        parseAgentConfig("a", { approvals: { tools: { exec: { mode: "ask", allowArguments: { command: ["("] } } } } }),
      (err: Error) =>
        err instanceof AgentConfigError && /approvals\.tools\.exec\.allowArguments\.command/.test(err.message),
    );
    assert.throws(() => parseAgentConfig("a", { approvals: { tools: { exec: "maybe" } } }), AgentConfigError);
  });
});

/** An actor whose agent asks before `slow` runs; the model calls slow once, then answers what it read. */
async function waitingSession(
  approvals: ApprovalPolicy = { tools: { slow: "ask" } },
  over: { model?: ScriptedModel } = {},
) {
  const ran: string[] = [];
  const model =
    over.model ??
    new ScriptedModel((r, n) => {
      if (n === 0) return call(["slow", { text: "rm -rf build" }]);
      const tool = [...r.messages].reverse().find((m) => m.role === "tool");
      return say(`done: ${tool && "content" in tool ? String(tool.content) : lastUser(r)}`);
    });
  const made = await newActor(() => testRunDeps(model, [echoTool("slow", 0, ran)], { config: { approvals } }));
  await made.actor.submit(prompt("clean up"));
  await made.events.waitFor((e) => e.payload.case === "runWaiting");
  return { ...made, ran, model };
}

const decision = (
  toolCallId: string,
  verdict: ToolVerdict,
  extra: { message?: string; argumentsJson?: string } = {},
  id?: string,
) => frame({ case: "toolDecision", value: { toolCallId, verdict, decidedBy: "alice", ...extra } }, id);

const HELD = "call-0-slow";
const refusal = async (p: Promise<unknown>): Promise<RpcError> => {
  try {
    await p;
  } catch (err) {
    return err as RpcError;
  }
  assert.fail("the decision was taken");
};

describe("a run that waits on a decision", () => {
  test("asks, waits without running anything, and goes on when approved", async () => {
    const { actor, events, ran } = await waitingSession();
    const [asked] = events.of("toolApprovalRequested");
    assert.equal(asked.toolCallId, HELD);
    assert.equal(asked.toolName, "slow");
    assert.equal(asked.principal, "alice");
    assert.match(asked.rule, /rule for slow: ask/);
    assert.deepEqual(events.of("runWaiting")[0].toolCallIds, [HELD]);
    assert.deepEqual(ran, [], "nothing ran before the decision");
    assert.equal(events.of("agentEnd").length, 0, "the run has not ended");
    await actor.whenIdle();
    assert.ok(actor.waitingOnDecision);
    assert.equal(actor.running, false);
    assert.deepEqual(
      actor.info().pending.map((p) => [p.toolCallId, p.toolName]),
      [[HELD, "slow"]],
    );
    const turn = events.events.find((e) => e.payload.case === "runWaiting")!.turnId;

    const ack = await actor.submit(decision(HELD, ToolVerdict.APPROVE, {}, "d1"));
    assert.equal(ack.payload.case, "frameAccepted");
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, ["rm -rf build"]);
    const decided = events.events.find((e) => e.payload.case === "toolDecided")!;
    assert.equal(decided.turnId, turn, "the decision belongs to the waiting run");
    assert.equal(events.of("toolDecided")[0].decidedBy, "alice");
    assert.equal(events.of("runResumed")[0].afterWait, true);
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.COMPLETED);
    assert.ok(events.events.filter((e) => e.payload.case === "agentEnd").every((e) => e.turnId === turn));
    assert.equal(actor.info().pending.length, 0);
  });

  test("a rejection is the call's result, with the person's message; the tool never runs", async () => {
    const { actor, events, ran } = await waitingSession();
    await actor.submit(decision(HELD, ToolVerdict.REJECT, { message: "not the build folder" }));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, []);
    const result = actor.history.messages.find((m) => m.role === Role.TOOL)!;
    assert.equal(result.isError, true);
    assert.match(result.text, /alice rejected this call: not the build folder/);
    assert.match(actor.history.messages.at(-1)!.text, /done: Not run: alice rejected/);
  });

  test("an edit runs the tool with the new arguments and tells the model so; a bad edit changes nothing", async () => {
    const { actor, events, ran } = await waitingSession();
    const bad = await refusal(actor.submit(decision(HELD, ToolVerdict.EDIT, { argumentsJson: '{"text": 5}' })));
    assert.equal(bad.code, Status.INVALID_ARGUMENT);
    assert.match(bad.message, /must be string/);
    assert.ok(actor.waitingOnDecision, "still waiting after a refused edit");
    await actor.submit(decision(HELD, ToolVerdict.EDIT, { argumentsJson: '{"text": "rm -rf build/tmp"}' }));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, ["rm -rf build/tmp"]);
    const result = actor.history.messages.find((m) => m.role === Role.TOOL)!;
    assert.match(result.text, /edited by alice/);
  });

  test("decisions are taken once: unknown call NOT_FOUND, the same again a duplicate, another FAILED_PRECONDITION", async () => {
    const { actor, events, ran } = await waitingSession({ tools: { slow: "ask" } });
    const unknown = await refusal(actor.submit(decision("call-9", ToolVerdict.APPROVE)));
    assert.equal(unknown.code, Status.NOT_FOUND);
    await actor.submit(decision(HELD, ToolVerdict.REJECT, { message: "no" }));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    // After the run ended the call waits no more: asking about it is NOT_FOUND, never a second run.
    const late = await refusal(actor.submit(decision(HELD, ToolVerdict.APPROVE)));
    assert.equal(late.code, Status.NOT_FOUND);
    assert.deepEqual(ran, []);
  });

  test("a batch's held calls are asked together; the same decision twice is a duplicate, another refused", async () => {
    // Two held calls, so the first decision does not end the wait.
    const model = new ScriptedModel((_, n) =>
      n === 0 ? call(["slow", { text: "a" }], ["slow", { text: "b" }]) : say("finished"),
    );
    const { actor, events, ran } = await waitingSession({ tools: { slow: "ask" } }, { model });
    assert.equal(events.of("toolApprovalRequested").length, 2);
    await actor.submit(decision(HELD, ToolVerdict.APPROVE, {}, "first"));
    const again = await actor.submit(decision(HELD, ToolVerdict.APPROVE, {}, "second"));
    assert.equal(again.payload.case === "frameAccepted" && again.payload.value.duplicate, true);
    const other = await refusal(actor.submit(decision(HELD, ToolVerdict.REJECT)));
    assert.equal(other.code, Status.FAILED_PRECONDITION);
    assert.match(other.message, /already approved by alice/);
    assert.equal(events.of("toolDecided").length, 1);
    assert.ok(actor.waitingOnDecision, "one call is still undecided");
    await actor.submit(decision("call-1-slow", ToolVerdict.APPROVE));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, ["a", "b"]);
  });

  test("survives a reload from the log: still waiting, the deadline kept, and a decision then runs the call", async () => {
    const { actor, store, deps, ran } = await waitingSession();
    const deadline = actor.info().pending[0].deadline;
    await actor.close({ handOver: true });
    const again = await SessionActor.load(actor.ref, deps);
    const events = new Collector();
    await again.attach(events);
    await again.whenIdle();
    assert.ok(again.waitingOnDecision);
    assert.deepEqual(again.info().pending[0].deadline, deadline);
    assert.deepEqual(ran, []);
    await again.submit(decision(HELD, ToolVerdict.APPROVE));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, ["rm -rf build"]);
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.COMPLETED);
    assert.ok(store);
  });

  test("a decision whose frame the log has but whose ToolDecided it lacks is taken on load", async () => {
    const { actor, store, deps, ran } = await waitingSession();
    await actor.close({ handOver: true });
    // As if the runner died between recording the decision's frame and publishing its event.
    const { log } = await store.activate(actor.ref);
    const { toJson } = await import("@bufbuild/protobuf");
    const { ClientFrameSchema } = await import("../../services/shared/gen/troupe/v1/session_pb.js");
    await log.append(
      { t: "frame", frame: toJson(ClientFrameSchema, decision(HELD, ToolVerdict.APPROVE, {}, "d-cut")) },
      true,
    );
    await log.close();
    const again = await SessionActor.load(actor.ref, deps);
    const events = new Collector();
    await again.attach(events, 0);
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, ["rm -rf build"]);
    assert.equal(events.of("toolDecided")[0].frameId, "d-cut");
  });

  test("the policy's timeout rejects the call and the run goes on", async () => {
    const { actor, events, ran } = await waitingSession({ tools: { slow: "ask" }, timeoutSeconds: 1 });
    await events.waitFor((e) => e.payload.case === "agentEnd", 0, 4000);
    assert.deepEqual(ran, []);
    assert.equal(events.of("toolDecided")[0].decidedBy, "policy:timeout");
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.COMPLETED);
    assert.match(actor.history.messages.find((m) => m.role === Role.TOOL)!.text, /nobody decided in time/);
  });

  test("a timeout with onTimeout abort ends the run", async () => {
    const { events, ran } = await waitingSession({ tools: { slow: "ask" }, timeoutSeconds: 1, onTimeout: "abort" });
    await events.waitFor((e) => e.payload.case === "agentEnd", 0, 4000);
    assert.deepEqual(ran, []);
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.ABORTED);
  });

  test("an abort ends a waiting run at once: the held call is answered, agent_end ABORTED", async () => {
    const { actor, events, ran } = await waitingSession();
    await actor.submit(frame({ case: "abort", value: { reason: "changed my mind" } }));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.ABORTED);
    assert.deepEqual(ran, []);
    assert.match(actor.history.messages.find((m) => m.role === Role.TOOL)!.text, /aborted while this call waited/);
    assert.equal(actor.waitingOnDecision, false);
    // The session takes new work afterwards.
    await actor.submit(prompt("again"));
    await events.waitFor((e) => e.payload.case === "agentEnd" && events.of("agentEnd").length === 2);
    assert.equal(events.of("agentEnd")[1].stopReason, StopReason.COMPLETED);
  });

  test("steering ends the wait: the held call is skipped and the message goes in", async () => {
    const { actor, events, ran } = await waitingSession();
    await actor.submit(frame({ case: "steer", value: { text: "leave the build folder alone" } }));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, []);
    assert.deepEqual(events.of("toolCallsSkipped")[0].toolCallIds, [HELD]);
    assert.equal(events.of("agentEnd")[0].stopReason, StopReason.COMPLETED);
    assert.match(actor.history.messages.at(-1)!.text, /leave the build folder alone|Skipped/);
  });

  test("a follow-up prompt waits behind the waiting run and runs after it", async () => {
    const { actor, events } = await waitingSession();
    const ack = await actor.submit(prompt("and then this", undefined, QueueMode.FOLLOWUP));
    assert.equal(ack.payload.case, "frameAccepted");
    assert.equal(events.of("agentStart").length, 1, "nothing started beside the waiting run");
    await actor.submit(decision(HELD, ToolVerdict.APPROVE));
    await events.waitFor((e) => e.payload.case === "agentEnd" && events.of("agentEnd").length === 2);
    assert.equal(events.of("agentStart").length, 2);
  });

  test("deny: the call is answered as denied without asking anyone", async () => {
    const model = new ScriptedModel((_, n) => (n === 0 ? call(["slow", { text: "x" }]) : say("ok")));
    const ran: string[] = [];
    const { actor, events } = await newActor(() =>
      testRunDeps(model, [echoTool("slow", 0, ran)], { config: { approvals: { tools: { slow: "deny" } } } }),
    );
    await actor.submit(prompt("go"));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.deepEqual(ran, []);
    assert.equal(events.of("toolApprovalRequested").length, 0);
    assert.match(actor.history.messages.find((m) => m.role === Role.TOOL)!.text, /approval policy denies/);
  });
});
