// One turn is one trace across gateway, runner, memory and sandbox: every process exports its
// spans over OTLP/HTTP to a collector run by this test, and the test reads them back.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { once } from "node:events";
import { grpc } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

interface Span {
  service: string;
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Record<string, unknown>;
  links: { traceId: string; spanId: string }[];
}

const spans: Span[] = [];
let collector: http.Server;
let stack: Stack;

function attrValue(v: Record<string, unknown>): unknown {
  if ("stringValue" in v) return v.stringValue;
  if ("intValue" in v) return Number(v.intValue);
  if ("doubleValue" in v) return v.doubleValue;
  if ("boolValue" in v) return v.boolValue;
  if ("arrayValue" in v) return ((v.arrayValue as { values?: Record<string, unknown>[] }).values ?? []).map(attrValue);
  return undefined;
}
const attrs = (list: { key: string; value: Record<string, unknown> }[] = []) =>
  Object.fromEntries(list.map((a) => [a.key, attrValue(a.value)]));

before(async () => {
  collector = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    let body: {
      resourceSpans?: { resource?: { attributes?: [] }; scopeSpans?: { spans?: Record<string, never>[] }[] }[];
    };
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch (err) {
      console.error("collector: not JSON:", req.headers["content-type"], String(err));
      res.writeHead(400).end();
      return;
    }
    for (const rs of body.resourceSpans ?? []) {
      const service = String(attrs(rs.resource?.attributes)["service.name"]);
      for (const ss of rs.scopeSpans ?? []) {
        for (const s of ss.spans ?? []) {
          spans.push({
            service,
            traceId: s.traceId,
            spanId: s.spanId,
            parentSpanId: s.parentSpanId ?? "",
            name: s.name,
            kind: s.kind,
            attributes: attrs(s.attributes),
            links: ((s as { links?: { traceId: string; spanId: string }[] }).links ?? []).map((l) => ({
              traceId: l.traceId,
              spanId: l.spanId,
            })),
          });
        }
      }
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end("{}");
  });
  collector.listen(0, "127.0.0.1");
  await once(collector, "listening");
  const port = (collector.address() as { port: number }).port;
  stack = await startStack({
    env: {
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_BSP_SCHEDULE_DELAY: "100",
    },
  });
});

after(async () => {
  await stack?.stop();
  collector?.close();
});

test("a turn with a tool call is one trace through gateway, runner, memory and sandbox", async () => {
  const s = new ChatSession(stack.gateway);
  s.open();
  const opened = await s.waitOpened();
  s.prompt("$ echo traced");
  await s.waitForPayload("agentEnd", 30_000);
  s.close();

  const runnerTurn = await waitFor("the runner's invoke_agent span", async () =>
    spans.find(
      (x) =>
        x.name === "invoke_agent main" &&
        x.service === "troupe-runner" &&
        x.attributes["gen_ai.conversation.id"] === opened.sessionId,
    ),
  );
  const traceId = runnerTurn.traceId;
  const inTrace = () => spans.filter((x) => x.traceId === traceId);
  await waitFor("the gateway, sandbox and memory spans", async () => {
    const names = inTrace().map((x) => `${x.service} ${x.name}`);
    return [
      "troupe-sandbox troupe.v1.SandboxService/Exec",
      "troupe-memory troupe.v1.MemoryService/SearchMemories",
      "troupe-gateway invoke_agent main",
    ].every((n) => names.includes(n));
  });
  const trace = inTrace();
  if (process.env.DEBUG_SPANS)
    console.log(
      spans
        .map(
          (x) =>
            `${x.traceId.slice(0, 8)} ${x.spanId.slice(0, 6)}<-${x.parentSpanId.slice(0, 6)} ${x.service} ${x.name}`,
        )
        .join("\n"),
    );
  const services = new Set(trace.map((x) => x.service));
  for (const svc of ["troupe-gateway", "troupe-runner", "troupe-memory", "troupe-sandbox"])
    assert.ok(services.has(svc), `${svc} is in the trace (${[...services]})`);

  const byName = (name: string) => trace.filter((x) => x.name === name);
  const gatewayTurn = byName("invoke_agent main").find((x) => x.service === "troupe-gateway");
  assert.ok(gatewayTurn, "the gateway opened the turn's span");
  assert.equal(gatewayTurn.kind, 3, "CLIENT: the gateway invokes a remote agent");
  assert.equal(runnerTurn.kind, 1, "INTERNAL: the runner runs the agent");
  assert.equal(runnerTurn.parentSpanId, gatewayTurn.spanId, "the runner's turn is a child of the gateway's");
  assert.equal(runnerTurn.attributes["gen_ai.operation.name"], "invoke_agent");
  assert.equal(runnerTurn.attributes["gen_ai.agent.id"], "main");

  const chats = byName("chat scripted-1");
  assert.equal(chats.length, 2, "two model calls: the tool call, then the answer");
  for (const c of chats) {
    assert.equal(c.parentSpanId, runnerTurn.spanId);
    assert.equal(c.kind, 3);
    assert.equal(c.attributes["gen_ai.operation.name"], "chat");
    assert.equal(c.attributes["gen_ai.request.model"], "scripted-1");
    assert.ok(Number(c.attributes["gen_ai.usage.output_tokens"]) > 0);
    assert.ok(typeof c.attributes["gen_ai.provider.name"] === "string");
  }
  const tool = byName("execute_tool exec")[0];
  assert.ok(tool, "the tool call has its span");
  assert.equal(tool.parentSpanId, runnerTurn.spanId);
  assert.equal(tool.attributes["gen_ai.tool.name"], "exec");
  assert.ok(String(tool.attributes["gen_ai.tool.call.id"]).length > 0);

  // The sandbox's server span hangs under the runner's client span, under execute_tool.
  const execServer = trace.find((x) => x.service === "troupe-sandbox" && x.name === "troupe.v1.SandboxService/Exec")!;
  const execClient = trace.find((x) => x.spanId === execServer.parentSpanId)!;
  assert.equal(execClient.service, "troupe-runner");
  assert.equal(execClient.parentSpanId, tool.spanId);

  // The run's records reach the session log in durable batches, each a span inside the turn.
  const appends = trace.filter((x) => x.name === "append session log");
  assert.ok(appends.length > 0, "the session log's appends are in the turn's trace");
  for (const a of appends) {
    assert.equal(a.service, "troupe-runner");
    assert.equal(a.attributes["troupe.store"], "files");
    assert.ok(Number(a.attributes["troupe.store.records"]) >= 1);
  }
});

test("a client's own traceparent holds the whole turn: the Chat call, the router's placement and every service", async () => {
  const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
  const metadata = new grpc.Metadata();
  metadata.set("traceparent", `00-${traceId}-00f067aa0ba902b7-01`);
  // Another owner than the first test's: its memory scope is not yet known to be empty, so the
  // runner searches it (memory-recall.ts caches an empty scope for a few seconds).
  const gateway = await stack.gatewayAs("acme", "carol");
  const s = new ChatSession(gateway, { metadata });
  s.open();
  await s.waitOpened();
  s.prompt("$ echo under-the-client-trace");
  await s.waitForPayload("agentEnd", 30_000);
  s.close();
  gateway.close();

  const wanted = [
    "troupe-gateway troupe.v1.GatewayService/Chat",
    "troupe-router troupe.v1.RouterService/ResolveSession",
    "troupe-runner invoke_agent main",
    "troupe-memory troupe.v1.MemoryService/SearchMemories",
    "troupe-sandbox troupe.v1.SandboxService/Exec",
  ];
  const names = () => new Set(spans.filter((x) => x.traceId === traceId).map((x) => `${x.service} ${x.name}`));
  await waitFor("every service's spans under the client's trace id", async () =>
    wanted.every((n) => names().has(n)),
  ).catch((err) => {
    throw new Error(`${err.message}; the trace has: ${[...names()].join(", ")}`);
  });
  const trace = spans.filter((x) => x.traceId === traceId);
  const chat = trace.find((x) => x.name === "troupe.v1.GatewayService/Chat")!;
  assert.equal(chat.parentSpanId, "00f067aa0ba902b7", "the gateway's Chat span is the client's child");
  // The placement hangs under the Chat call (through the gateway's client span for it).
  const resolve = trace.find(
    (x) => x.name === "troupe.v1.RouterService/ResolveSession" && x.service === "troupe-router",
  )!;
  const resolveClient = trace.find((x) => x.spanId === resolve.parentSpanId)!;
  assert.equal(resolveClient.service, "troupe-gateway");
  assert.equal(resolveClient.parentSpanId, chat.spanId);
  // The model calls say when their first chunk came, before the call ended.
  for (const c of trace.filter((x) => x.name.startsWith("chat ")))
    assert.ok(Number(c.attributes["gen_ai.response.time_to_first_chunk"]) > 0, "time to first chunk");

  // Recall is its own span in the runner, with what came back; the memory service's search
  // embeds the query under it, as a GenAI embeddings operation.
  const recall = trace.find((x) => x.service === "troupe-runner" && x.name === "recall memories")!;
  assert.ok(recall, "the runner's recall span");
  assert.equal(typeof recall.attributes["troupe.memory.results"], "number");
  const search = trace.find(
    (x) => x.service === "troupe-memory" && x.name === "troupe.v1.MemoryService/SearchMemories",
  )!;
  assert.equal(trace.find((x) => x.spanId === search.parentSpanId)?.parentSpanId, recall.spanId);
  const embed = trace.find((x) => x.service === "troupe-memory" && x.name.startsWith("embeddings "))!;
  assert.ok(embed, "the query's embedding");
  assert.equal(embed.parentSpanId, search.spanId);
  assert.equal(embed.attributes["gen_ai.operation.name"], "embeddings");

  // Learning comes after the answer, on a trace of its own that links to the run.
  const run = trace.find((x) => x.service === "troupe-runner" && x.name === "invoke_agent main")!;
  const learn = await waitFor("the learning span", async () =>
    spans.find((x) => x.name === "learn" && x.links.some((l) => l.spanId === run.spanId)),
  );
  assert.notEqual(learn.traceId, traceId, "not part of the answer's trace");
  assert.equal(learn.links[0].traceId, traceId);
  await waitFor("learning's call to the memory service under it", async () =>
    spans.some((x) => x.traceId === learn.traceId && x.name === "troupe.v1.MemoryService/LearnFromTurn"),
  );
});
