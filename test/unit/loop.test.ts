// The agent loop called directly: a run's host is a plain object whose queues the test fills, and
// the model is scripted. Steering between tool groups, follow-ups, retries, fallback, compaction,
// abort and the run quotas.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { ROOT_CONTEXT } from "@opentelemetry/api";
import { create } from "@bufbuild/protobuf";
import {
  ChatMessageSchema,
  FrameKind,
  Role,
  StopReason,
  type ChatMessage,
} from "../../services/shared/gen/troupe/v1/session_pb.js";
import { runAgent } from "../../services/runner/loop/loop.js";
import { SUMMARY_MARKER, type EventPayload, type QueuedMessage, type RunHost } from "../../services/runner/loop/run.js";
import { ModelError } from "../../services/runner/providers/model.js";
import { ScriptedModel, call, echoTool, lastUser, say, testRunDeps } from "../helpers/in-process.js";

let n = 0;
const user = (text: string, kind = FrameKind.PROMPT): QueuedMessage => ({
  frameId: `q${++n}`,
  kind,
  text,
  traceContext: ROOT_CONTEXT,
});

const chat = (role: Role, text: string): ChatMessage =>
  create(ChatMessageSchema, { id: `m${++n}`, role, text, stopReason: StopReason.COMPLETED });

/** A run's host: `steering` and `followUps` are handed out one batch per call. */
function host(
  opts: {
    signal?: AbortSignal;
    steering?: QueuedMessage[][];
    followUps?: QueuedMessage[][];
    messages?: ChatMessage[];
    model?: string;
    reasoningEffort?: string;
    contextFrom?: number;
  } = {},
) {
  const events: EventPayload[] = [];
  let compaction: { summary: string; firstKeptMessageId: string } | undefined;
  const h: RunHost & {
    events: EventPayload[];
    of: <K extends EventPayload["case"]>(k: K) => Extract<EventPayload, { case: K }>["value"][];
  } = {
    sessionId: "s",
    model: opts.model ?? "",
    reasoningEffort: opts.reasoningEffort ?? "",
    contextFrom: opts.contextFrom ?? 0,
    conversationBefore: 0,
    signal: opts.signal ?? new AbortController().signal,
    messages: opts.messages ?? [],
    emit: (p) => {
      events.push(p);
      // As the actor does: the latest compaction_end is what the model's view starts from.
      if (p.case === "compactionEnd")
        compaction = { summary: p.value.summary ?? "", firstKeptMessageId: p.value.firstKeptMessageId ?? "" };
    },
    delta: () => undefined,
    pressure: () => undefined,
    takeSteering: () => opts.steering?.shift() ?? [],
    takeFollowUps: () => opts.followUps?.shift() ?? [],
    compaction: () => compaction,
    elide: (ids) => {
      const gone = new Set(ids);
      h.messages.splice(0, h.messages.length, ...h.messages.filter((m) => !gone.has(m.id)));
    },
    isHeld: () => false,
    decisionOf: () => undefined,
    clientTools: [],
    clientResultOf: () => undefined,
    events,
    of: (k) => events.filter((e) => e.case === k).map((e) => e.value) as never,
  };
  return h;
}

const texts = (h: RunHost, role: Role) => h.messages.filter((m) => m.role === role).map((m) => m.text);

describe("the loop", () => {
  test("steering is looked for between tool groups: the rest of the batch is skipped, the message goes in", async () => {
    const ran: string[] = [];
    const model = new ScriptedModel((r, i) =>
      i === 0 ? call(["t", { text: "1" }], ["t", { text: "2" }]) : say(`after: ${lastUser(r)}`),
    );
    // Nothing before the first call; steering before the second.
    const h = host({ steering: [[], [user("turn left", FrameKind.STEER)]] });
    const out = await runAgent(h, testRunDeps(model, [echoTool("t", 0, ran)]), [user("go")]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.deepEqual(ran, ["1"]);
    assert.equal(h.of("toolCallsSkipped").length, 1);
    assert.deepEqual(texts(h, Role.USER), ["go", "turn left"]);
    assert.equal(texts(h, Role.ASSISTANT).at(-1), "after: turn left");
  });

  test("follow-ups join once the model asks for no more tools", async () => {
    const model = new ScriptedModel((r) => say(`re: ${lastUser(r)}`));
    const h = host({ followUps: [[user("and another", FrameKind.FOLLOW_UP)]] });
    await runAgent(h, testRunDeps(model), [user("first")]);
    assert.deepEqual(texts(h, Role.ASSISTANT), ["re: first", "re: and another"]);
    assert.equal(h.of("agentEnd").length, 1, "one run");
  });

  test("a retryable failure is retried with an event; a model that keeps failing falls back to the next", async () => {
    let calls = 0;
    const flaky = new ScriptedModel(() => (calls++ === 0 ? new ModelError("overloaded", true, 503) : say("recovered")));
    const h1 = host();
    await runAgent(h1, testRunDeps(flaky), [user("x")]);
    assert.deepEqual(
      h1.of("modelRetry").map((r) => r.httpStatus),
      [503],
    );
    assert.equal(texts(h1, Role.ASSISTANT)[0], "recovered");

    const down = new ScriptedModel((r) =>
      r.model === "test-model" ? new ModelError("down", true, 503) : say(`answered by ${r.model}`),
    );
    const h2 = host();
    const out = await runAgent(h2, testRunDeps(down, [], { config: { fallbacks: ["backup"] } }), [user("x")]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.equal(h2.of("modelRetry").length, 2, "the policy's retries first");
    assert.deepEqual(
      h2.of("modelFallback").map((f) => [f.fromModel, f.toModel]),
      [["test-model", "backup"]],
    );
    assert.equal(texts(h2, Role.ASSISTANT)[0], "answered by backup");
  });

  test("a session's model leads the chain while its agent allows it, then the agent's fallbacks", async () => {
    const asked: string[] = [];
    const model = new ScriptedModel((r) => {
      asked.push(r.model);
      return r.model === "chosen" ? new ModelError("down", true, 503) : say(`answered by ${r.model}`);
    });
    const config = {
      models: ["chosen"],
      fallbacks: ["backup"],
      retry: { maxRetries: 0, baseDelayMs: 1, maxDelayMs: 1 },
    };
    const h = host({ model: "chosen" });
    await runAgent(h, testRunDeps(model, [], { config }), [user("x")]);
    assert.deepEqual(
      h.of("agentStart").map((a) => a.model),
      ["chosen"],
    );
    assert.deepEqual(asked, ["chosen", "backup"], "the agent's fallbacks follow the session's choice");
    assert.equal(texts(h, Role.ASSISTANT)[0], "answered by backup");

    // The agent stopped allowing it (agent.json changed): the run says so and uses the agent's model.
    asked.length = 0;
    const h2 = host({ model: "chosen" });
    await runAgent(h2, testRunDeps(model, [], { config: { fallbacks: ["backup"] } }), [user("x")]);
    assert.deepEqual(asked, ["test-model"]);
    const notes = h2.of("error").map((e) => [e.code, e.message]);
    assert.equal(notes.length, 1);
    assert.equal(notes[0][0], "AGENT_CONFIG");
    assert.match(
      notes[0][1] ?? "",
      /model chosen is not one agent main allows \(it allows test-model, backup\); this run uses test-model/,
    );
  });

  test("a session's reasoning effort replaces its agent's; after a reset the model sees only what came since", async () => {
    const model = new ScriptedModel(() => say("ok"));
    const earlier = [chat(Role.USER, "before the reset"), chat(Role.ASSISTANT, "an answer from before")];
    const h = host({ reasoningEffort: "high", messages: [...earlier], contextFrom: earlier.length });
    await runAgent(h, testRunDeps(model, [], { config: { reasoningEffort: "low" } }), [user("after it")]);
    const request = model.requests[0];
    assert.equal(request.reasoningEffort, "high");
    const said = request.messages.map((m) => (m as { content?: unknown }).content).filter((c) => typeof c === "string");
    assert.ok(said.includes("after it"));
    assert.ok(!said.some((c) => String(c).includes("before the reset")), `sent: ${JSON.stringify(said)}`);
    assert.equal(texts(h, Role.USER)[0], "before the reset", "the history keeps what the model no longer sees");

    // Without a session's own effort, the agent's stands.
    const again = new ScriptedModel(() => say("ok"));
    await runAgent(host(), testRunDeps(again, [], { config: { reasoningEffort: "low" } }), [user("x")]);
    assert.equal(again.requests[0].reasoningEffort, "low");
  });

  test("steering and follow-ups rebuild the system prompt for their question", async () => {
    const asked: string[] = [];
    const model = new ScriptedModel((_, i) => (i === 0 ? call(["echo", { text: "a" }]) : say(`answer ${i}`)));
    const h = host({
      steering: [[user("now about cats", FrameKind.STEER)]],
      followUps: [[user("and dogs", FrameKind.FOLLOW_UP)]],
    });
    const deps = testRunDeps(model, [echoTool("echo")], {
      systemPrompt: async (req) => {
        asked.push(req.query);
        return { text: `about: ${req.query}`, tokens: 3, warnings: [] };
      },
    });
    await runAgent(h, deps, [user("first question")]);
    assert.deepEqual(asked, ["first question", "now about cats", "and dogs"]);
    assert.deepEqual(
      model.requests.map((r) => (r.messages[0] as { content: string }).content),
      ["about: first question", "about: now about cats", "about: and dogs"],
    );
  });

  test("a heartbeat that says only HEARTBEAT_OK leaves the history as it was; one with news stays", async () => {
    const earlier: ChatMessage[] = [];
    const h = host({ messages: earlier });
    await runAgent(h, testRunDeps(new ScriptedModel(() => say("hello"))), [user("hi")]);
    const before = texts(h, Role.USER).length + texts(h, Role.ASSISTANT).length;
    const beat = (n: number): QueuedMessage => ({
      ...user("Heartbeat: anything?"),
      frameId: `trigger:heartbeat:hb:${n}`,
    });
    const learned: string[] = [];
    const quiet = testRunDeps(new ScriptedModel(() => say("HEARTBEAT_OK")), [], {
      afterRun: () => void learned.push("quiet"),
    });
    const out = await runAgent(h, quiet, [beat(1)]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.equal(texts(h, Role.USER).length + texts(h, Role.ASSISTANT).length, before, "nothing kept");
    assert.deepEqual(learned, [], "nothing learned from it");
    await runAgent(h, testRunDeps(new ScriptedModel(() => say("Your build failed at 03:00."))), [beat(2)]);
    assert.equal(texts(h, Role.ASSISTANT).at(-1), "Your build failed at 03:00.");
    // A user's own prompt answered HEARTBEAT_OK is an answer like any other.
    await runAgent(h, testRunDeps(new ScriptedModel(() => say("HEARTBEAT_OK"))), [user("say the code word")]);
    assert.equal(texts(h, Role.ASSISTANT).at(-1), "HEARTBEAT_OK");
  });

  test("a fallback holds for the rest of the run: later steps do not wait out the failing model again", async () => {
    const down = new ScriptedModel((r) => {
      if (r.model === "test-model") return new ModelError("down", true, 503);
      return r.messages.some((m) => m.role === "tool") ? say("done") : call(["echo", { text: "x" }]);
    });
    const h = host();
    const out = await runAgent(h, testRunDeps(down, [echoTool("echo")], { config: { fallbacks: ["backup"] } }), [
      user("x"),
    ]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.equal(h.of("modelFallback").length, 1);
    assert.deepEqual(
      down.requests.map((r) => r.model),
      ["test-model", "test-model", "test-model", "backup", "backup"],
      "the policy's tries of the model, then the backup for both steps",
    );
  });

  test("a request over the context window is compacted into a summary and the turn goes on", async () => {
    const model = new ScriptedModel((r) => {
      const system = r.messages[0] && "content" in r.messages[0] ? r.messages[0].content : "";
      if (system.startsWith(SUMMARY_MARKER) || system.includes(SUMMARY_MARKER))
        return say("## Goal\nthe goal\n## Constraints\n## Progress\n## Decisions\n## Next steps");
      return r.messages.length > 4
        ? new ModelError("context_length_exceeded: too many tokens", false, 400)
        : say(`fits in ${r.messages.length}`);
    });
    const earlier: ChatMessage[] = [];
    const h0 = host({ messages: earlier });
    for (const t of ["one", "two", "three"])
      await runAgent(h0, testRunDeps(new ScriptedModel(() => say("ok"))), [user(t)]);
    const h = host({ messages: earlier });
    const out = await runAgent(h, testRunDeps(model, [], { config: { keepRecentTokens: 1 } }), [user("four")]);
    assert.equal(out.stopReason, StopReason.COMPLETED, JSON.stringify(h.of("error")));
    assert.equal(h.of("compactionStart")[0]?.reason, "overflow");
    assert.equal(h.of("compactionEnd").length, 1);
    assert.match(texts(h, Role.ASSISTANT).at(-1)!, /^fits in/);
  });

  test("tokens are counted by a bound until it passes the window; then exactly, so a fitting view is not compacted", async () => {
    const config = { contextWindow: 1024, reserveTokens: 64, maxOutputTokens: 300 };
    const model = new ScriptedModel(() => say("ok"));
    const short = testRunDeps(model, [], { config });
    await runAgent(host(), short, [user("hello")]);
    assert.equal((await short.tokens("test-model")).isExact, false, "a short conversation loads no tokenizer table");
    // 1,200 bytes: over the window by the bound (bytes), about 200 tokens by the tokenizer.
    const long = testRunDeps(model, [], { config });
    const h = host();
    const out = await runAgent(h, long, [user("hello ".repeat(200))]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.equal((await long.tokens("test-model")).isExact, true);
    assert.equal(h.of("compactionStart").length, 0, "fits by the exact count");
    assert.equal(model.requests.at(-1)?.maxTokens, 300, "the reply keeps its full room");
  });

  test("a system prompt counted by the bound is counted again when another run has made the counter exact since", async () => {
    const config = { contextWindow: 1024, reserveTokens: 64, maxOutputTokens: 300 };
    const model = new ScriptedModel(() => say("ok"));
    const deps = testRunDeps(model, [], { config });
    deps.systemPrompt = async () => {
      const counter = await deps.tokens("test-model");
      const text = "word ".repeat(150);
      const tokens = counter.text(text); // 750 by the bound, about 150 exactly
      await counter.exact(); // as another session's run would, meanwhile
      return { text, tokens, warnings: [] };
    };
    const out = await runAgent(host(), deps, [user("hello")]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.equal(model.requests.at(-1)?.maxTokens, 300, "the reply keeps its full room");
  });

  test("a small window's system prompt budget counts the tools exactly when their bound would take much of it", async () => {
    const config = { contextWindow: 4096, reserveTokens: 256, maxOutputTokens: 300 };
    const model = new ScriptedModel(() => say("ok"));
    // About 3,300 bytes of schema: by the bound (bytes x 1.25) more than the room the window
    // leaves, so the budget fell to its floor of 256; exactly, a few hundred tokens.
    const wordy = { ...echoTool("wordy"), description: "describes ".repeat(330) };
    const deps = testRunDeps(model, [wordy], { config });
    let budget = 0;
    deps.systemPrompt = async (req) => {
      budget = req.budget;
      return { text: "system", tokens: 1, warnings: [] };
    };
    const out = await runAgent(host(), deps, [user("hello")]);
    assert.equal(out.stopReason, StopReason.COMPLETED);
    assert.ok(budget > 1500, `the system prompt may take ${budget} tokens`);
    assert.equal((await deps.tokens("test-model")).isExact, true);
  });

  test("an abort reaches the model stream and the run ends as aborted, its messages kept", async () => {
    const controller = new AbortController();
    const model = new ScriptedModel(() => say("a b c d e f g h i j", 30));
    const h = host({ signal: controller.signal });
    setTimeout(() => controller.abort(new Error("stop")), 60);
    const out = await runAgent(h, testRunDeps(model), [user("long one")]);
    assert.equal(out.stopReason, StopReason.ABORTED);
    assert.deepEqual(texts(h, Role.USER), ["long one"], "the acknowledged message stays in the history");
  });

  test("the run quotas: past stepsPerRun the run ends with RUN_QUOTA; past toolCallsPerRun calls are answered, not run", async () => {
    const ran: string[] = [];
    const looping = new ScriptedModel(() => call(["t", { text: "again" }]));
    const h = host();
    const out = await runAgent(
      h,
      testRunDeps(looping, [echoTool("t", 0, ran)], { runQuotas: () => ({ stepsPerRun: 3, toolCallsPerRun: 100 }) }),
      [user("loop")],
    );
    assert.equal(out.stopReason, StopReason.ERROR);
    assert.equal(looping.requests.length, 3);
    assert.match(h.of("error").find((e) => e.code === "RUN_QUOTA")?.message ?? "", /quota of 3 model calls/);

    const batch = new ScriptedModel((_r, i) =>
      i === 0 ? call(["t", { text: "1" }], ["t", { text: "2" }], ["t", { text: "3" }]) : say("done"),
    );
    const ran2: string[] = [];
    const h2 = host();
    await runAgent(
      h2,
      testRunDeps(batch, [echoTool("t", 0, ran2)], { runQuotas: () => ({ stepsPerRun: 10, toolCallsPerRun: 2 }) }),
      [user("three calls")],
    );
    assert.deepEqual(ran2, ["1", "2"]);
    assert.match(h2.of("toolExecutionEnd")[2].result ?? "", /quota of tool calls/);
  });
});
