// The spans of one run, in-process, with OpenTelemetry's in-memory exporter: invoke_agent for the
// run, chat for each model call and execute_tool for each tool call under it, with the GenAI
// semantic-convention attributes a trace viewer reads.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { context, ROOT_CONTEXT, SpanKind, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { FrameKind } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { runAgent } from "../../services/runner/loop/loop.js";
import type { EventPayload, RunHost } from "../../services/runner/loop/run.js";
import { ScriptedModel, call, echoTool, say, testRunDeps } from "../helpers/in-process.js";

const exporter = new InMemorySpanExporter();
const contextManager = new AsyncLocalStorageContextManager();

before(() => {
  context.setGlobalContextManager(contextManager.enable());
  trace.setGlobalTracerProvider(new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] }));
});
after(() => {
  trace.disable();
  context.disable();
});

test("a run with a tool call is one trace: invoke_agent, then chat and execute_tool under it", async () => {
  const model = new ScriptedModel((_r, n) => (n === 0 ? call(["t", { text: "x" }]) : say("done")));
  const events: EventPayload[] = [];
  const host: RunHost = {
    sessionId: "traced",
    model: "",
    reasoningEffort: "",
    contextFrom: 0,
    conversationBefore: 0,
    signal: new AbortController().signal,
    messages: [],
    emit: (p) => void events.push(p),
    delta: () => undefined,
    pressure: () => undefined,
    takeSteering: () => [],
    takeFollowUps: () => [],
    compaction: () => undefined,
    elide: () => undefined,
    isHeld: () => false,
    decisionOf: () => undefined,
    clientTools: [],
    clientResultOf: () => undefined,
  };
  await runAgent(host, testRunDeps(model, [echoTool("t")]), [
    { frameId: "p", kind: FrameKind.PROMPT, text: "go", traceContext: ROOT_CONTEXT },
  ]);
  const spans = exporter.getFinishedSpans();
  const agent = spans.find((s) => s.name === "invoke_agent main");
  assert.ok(agent, spans.map((s) => s.name).join(", "));
  assert.equal(agent.kind, SpanKind.INTERNAL);
  assert.equal(agent.attributes["gen_ai.operation.name"], "invoke_agent");
  assert.equal(agent.attributes["gen_ai.conversation.id"], "traced");
  const chats = spans.filter((s) => s.name === "chat test-model");
  assert.equal(chats.length, 2, "one chat span per model call");
  for (const c of chats) {
    assert.equal(c.kind, SpanKind.CLIENT);
    assert.equal(c.attributes["gen_ai.request.model"], "test-model");
    assert.equal(c.spanContext().traceId, agent.spanContext().traceId);
    assert.equal(c.parentSpanContext?.spanId, agent.spanContext().spanId);
  }
  const tool = spans.find((s) => s.name === "execute_tool t");
  assert.ok(tool);
  assert.equal(tool.attributes["gen_ai.tool.name"], "t");
  assert.equal(tool.spanContext().traceId, agent.spanContext().traceId);
  assert.equal(tool.parentSpanContext?.spanId, agent.spanContext().spanId);
});
