// Tool calls that wait for a person: the approval policy's rules, and a session actor in-process
// (in-memory store, scripted model) that holds a call, waits, takes decisions, survives a reload
// from its log, and ends a wait by timeout, abort or steering.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  QueueMode,
  Role,
  SessionState,
  StopReason,
  ToolVerdict,
} from "../../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../../services/shared/errors.js";
import { approvalOf, type ApprovalPolicy } from "../../services/runner/tools/approvals.js";
import { parseAgentConfig, AgentConfigError } from "../../services/runner/agent-config.js";
import { SessionActor } from "../../services/runner/session/session-actor.js";
import { settledLog } from "../../services/runner/session/session-log.js";
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
    assert.equal(actor.info().state, SessionState.WAITING);
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
    assert.equal(actor.info().state, SessionState.IDLE);
  });

  test("a decision that comes as the run stops to wait is taken, and the run goes on without another frame", async () => {
    const ran: string[] = [];
    const model = new ScriptedModel((_r, n) => (n === 0 ? call(["slow", { text: "now" }]) : say("done")));
    const made = await newActor(() =>
      testRunDeps(model, [echoTool("slow", 0, ran)], { config: { approvals: { tools: { slow: "ask" } } } }),
    );
    // A client that approves the moment it is told the run waits: its decision is recorded and
    // placed while the run is still returning, before the session is in its waiting phase.
    let decided: Promise<unknown> | undefined;
    await made.actor.attach({
      send: (e) => {
        if (e.payload.case === "runWaiting") decided = made.actor.submit(decision(HELD, ToolVerdict.APPROVE));
      },
      pressure: () => undefined,
      close: () => undefined,
    });
    await made.actor.submit(prompt("go"));
    await made.events.waitFor((e) => e.payload.case === "agentEnd", 2000);
    await decided;
    assert.deepEqual(ran, ["now"]);
    assert.equal(made.events.of("agentEnd")[0].stopReason, StopReason.COMPLETED);
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
    // A run that waits is owed its deadline: a runner taking over must load it, so not settled.
    assert.equal(settledLog(store.records(actor.ref)), false);
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

describe("client tools", () => {
  const weather = {
    name: "get_weather",
    description: "the weather in a city",
    parametersJson: JSON.stringify({
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
      additionalProperties: false,
    }),
  };
  /** A model that calls get_weather once with `args`, then says what the tool answered. */
  const weatherModel = (args: Record<string, unknown> = { city: "Oslo" }) =>
    new ScriptedModel((r, n) => {
      if (n === 0) return call(["get_weather", args]);
      const tool = [...r.messages].reverse().find((m) => m.role === "tool");
      return say(`it is ${tool && "content" in tool ? String(tool.content) : "?"}`);
    });
  const result = (toolCallId: string, output: string, isError = false, id?: string) =>
    frame({ case: "clientToolResult", value: { toolCallId, output, isError } }, id);
  const CALL = "call-0-get_weather";

  test("declared for the session: offered to the model, its call goes to the client, the run waits for the result", async () => {
    const model = weatherModel();
    const { actor, events } = await newActor(() => testRunDeps(model, [echoTool("slow")]));
    await actor.settle({ clientTools: [weather as never] });
    await actor.submit(prompt("weather?"));
    const sent = await events.waitFor((e) => e.payload.case === "clientToolCall");
    assert.deepEqual(
      sent.payload.case === "clientToolCall" && [sent.payload.value.toolName, sent.payload.value.argumentsJson],
      ["get_weather", '{"city":"Oslo"}'],
    );
    assert.ok(
      model.requests[0].tools?.some((t) => t.name === "get_weather"),
      "the model saw the client's tool",
    );
    assert.ok(
      model.requests[0].tools?.some((t) => t.name === "slow"),
      "beside the agent's own",
    );
    await actor.whenIdle();
    assert.deepEqual(
      actor.info().pending.map((p) => [p.kind, p.toolName]),
      [["client", "get_weather"]],
    );
    await actor.submit(result(CALL, "sunny, 21 C", false, "r1"));
    const again = await actor.submit(result(CALL, "sunny, 21 C", false, "r2"));
    assert.equal(
      again.payload.case === "frameAccepted" && again.payload.value.duplicate,
      true,
      "sent twice, used once",
    );
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(actor.history.messages.at(-1)?.text, "it is sunny, 21 C");
    assert.equal(events.of("clientToolAnswered").length, 1);
    const other = await refusal(actor.submit(result(CALL, "rain")));
    assert.equal(other.code, Status.NOT_FOUND, "the run is over: nothing waits for a result any more");
  });

  test("declared with a prompt: for its run only, offered again after a reload, an error result allowed", async () => {
    const model = weatherModel();
    const { actor, events, deps } = await newActor(() => testRunDeps(model));
    await actor.submit(frame({ case: "prompt", value: { text: "weather?", clientTools: [weather] } }));
    await events.waitFor((e) => e.payload.case === "runWaiting");
    const wrong = await refusal(actor.submit(result("call-x", "?")));
    assert.equal(wrong.code, Status.NOT_FOUND);
    await actor.close({ handOver: true });
    const loaded = await SessionActor.load(actor.ref, deps);
    const later = new Collector();
    await loaded.attach(later);
    await loaded.submit(result(CALL, "the weather service is down", true));
    await later.waitFor((e) => e.payload.case === "agentEnd");
    assert.ok(
      model.requests.at(-1)?.tools?.some((t) => t.name === "get_weather"),
      "the resumed run offers it again",
    );
    const toolMessage = loaded.history.messages.find((m) => m.role === Role.TOOL)!;
    assert.equal(toolMessage.isError, true);
    assert.equal(toolMessage.text, "the weather service is down");
    // The next run has no client tools: they were the prompt's.
    await loaded.submit(prompt("and now?"));
    await later.waitFor((e) => e.payload.case === "agentEnd" && later.of("agentEnd").length === 2);
    assert.ok(!model.requests.at(-1)?.tools?.some((t) => t.name === "get_weather"));
  });

  test("a second, different result is refused; a client tool may not shadow the agent's", async () => {
    const { actor, events } = await newActor(() => testRunDeps(weatherModel(), [echoTool("slow")]));
    const shadow = await refusal(actor.settle({ clientTools: [{ ...weather, name: "slow" } as never] }));
    assert.equal(shadow.code, Status.INVALID_ARGUMENT);
    assert.match(shadow.message, /slow/);
    const inPrompt = await refusal(
      actor.submit(frame({ case: "prompt", value: { text: "x", clientTools: [{ ...weather, name: "slow" }] } })),
    );
    assert.equal(inPrompt.code, Status.INVALID_ARGUMENT);
    await actor.submit(frame({ case: "prompt", value: { text: "weather?", clientTools: [weather] } }));
    await events.waitFor((e) => e.payload.case === "runWaiting");
    await actor.submit(result(CALL, "sunny"));
    const changed = await refusal(actor.submit(result(CALL, "rainy")));
    assert.ok(changed.code === Status.FAILED_PRECONDITION || changed.code === Status.NOT_FOUND);
    await events.waitFor((e) => e.payload.case === "agentEnd");
  });

  test("arguments off the tool's schema never reach the client: the model is told why", async () => {
    const model = weatherModel({ town: "Oslo" });
    const { actor, events } = await newActor(() => testRunDeps(model));
    await actor.submit(frame({ case: "prompt", value: { text: "weather?", clientTools: [weather] } }));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(events.of("clientToolCall").length, 0);
    assert.match(actor.history.messages.find((m) => m.role === Role.TOOL)!.text, /do not match its schema/);
  });

  test("the approval policy applies to client tools: asked first, then sent to the client", async () => {
    const model = weatherModel();
    const { actor, events } = await newActor(() =>
      testRunDeps(model, [], { config: { approvals: { tools: { get_weather: "ask" } } } }),
    );
    await actor.submit(frame({ case: "prompt", value: { text: "weather?", clientTools: [weather] } }));
    await events.waitFor((e) => e.payload.case === "toolApprovalRequested");
    assert.equal(events.of("clientToolCall").length, 0, "not sent before it is approved");
    await actor.submit(decision(CALL, ToolVerdict.EDIT, { argumentsJson: '{"city": "Bergen"}' }));
    const sent = await events.waitFor((e) => e.payload.case === "clientToolCall");
    assert.equal(sent.payload.case === "clientToolCall" && sent.payload.value.argumentsJson, '{"city": "Bergen"}');
    await actor.submit(result(CALL, "windy"));
    await events.waitFor((e) => e.payload.case === "agentEnd");
    assert.equal(actor.history.messages.at(-1)?.text, "it is windy");
  });
});
