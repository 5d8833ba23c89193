// The descriptor -> grpc-js adapter, through a real grpc-js server and client on loopback.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { ChatResponseSchema, SubscribeResponseSchema } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { AttachResponseSchema } from "../services/shared/gen/troupe/v1/runner_pb.js";
import { context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import {
  Health,
  HealthCheckResponse_ServingStatus as Serving,
} from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { RouterService, ResolveSessionRequestSchema } from "../services/shared/gen/troupe/v1/router_pb.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { RpcError, Status } from "../services/shared/errors.js";
import { RpcServer, createClient, serviceDefinition } from "../services/shared/rpc.js";

const exporter = new InMemorySpanExporter();
let server: RpcServer;
let address: string;
let seenTraceIds: string[] = [];
/** What the server logged, with the trace that was active when it did. */
const logged: { msg: string; error: string; traceId: string }[] = [];
const record = (msg: string, fields?: Record<string, unknown>) =>
  logged.push({ msg, error: String(fields?.error ?? ""), traceId: trace.getActiveSpan()?.spanContext().traceId ?? "" });
const logger = { debug: record, info: record, warn: record, error: record };

before(async () => {
  // A real SDK in this process, so the test can see which trace each side's spans belong to.
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] }));

  server = new RpcServer({ maxMessageBytes: 1024, logger });
  server.add(RouterService, {
    resolveInbound: async () => ({}),
    async resolveSession(req) {
      seenTraceIds.push(trace.getActiveSpan()?.spanContext().traceId ?? "");
      if (req.sessionId === "boom") throw new Error("secret internal detail");
      if (req.sessionId === "missing") throw new RpcError(Status.NOT_FOUND, "no such session");
      return {
        sessionId: req.sessionId,
        agentId: req.agentId || "main",
        sessionKey: `k:${req.sessionId}`,
        runner: { runnerId: "r1", address: "x:1" },
      };
    },
    async registerRunner() {
      return { leaseTtlMs: 1 };
    },
    async listRunners() {
      return {
        runners: [
          { runnerId: "a", address: "a:1" },
          { runnerId: "b", address: "b:2" },
        ],
      };
    },
  });
  server.add(SandboxService, {
    async *exec(request: { command: string }) {
      if (request.command === "boom") throw new Error("stream internal detail");
      // Server streaming: echo the command back in pieces, then an exit status.
      for (const ch of request.command) yield { kind: { case: "stdout", value: Buffer.from(ch) } } as never;
      yield { kind: { case: "exit", value: { exitCode: 7 } } } as never;
    },
    async releaseSandbox() {
      throw new RpcError(Status.FAILED_PRECONDITION, "nope");
    },
    async killProcesses() {
      return { sandboxFound: false };
    },
    // Not exercised here.
    ...Object.fromEntries(
      ["signalExec", "readFile", "writeFile", "listFiles", "listSandboxes"].map((m) => [
        m,
        async () => Promise.reject(new RpcError(Status.UNIMPLEMENTED, m)),
      ]),
    ),
  } as never);
  const port = await server.listen("127.0.0.1:0");
  address = `127.0.0.1:${port}`;
});

after(async () => {
  await server.drain(1000);
});

describe("the rpc adapter", () => {
  test("service definitions follow the descriptor: paths, streaming flags, codec", () => {
    const def = serviceDefinition(SandboxService);
    assert.equal(def.exec.path, "/troupe.v1.SandboxService/Exec");
    assert.equal(def.exec.requestStream, false);
    assert.equal(def.exec.responseStream, true);
    const router = serviceDefinition(RouterService);
    const msg = create(ResolveSessionRequestSchema, { sessionId: "s", agentId: "a" });
    const bytes = router.resolveSession.requestSerialize(msg);
    assert.deepEqual(router.resolveSession.requestDeserialize(bytes), msg);
  });

  test("the runner's stream responses have the public ones' wire shape (the gateway forwards their bytes)", () => {
    const shape = (schema: DescMessage) =>
      schema.fields.map((f) => [
        f.number,
        f.name,
        f.fieldKind,
        f.fieldKind === "message" ? f.message.typeName : "",
        f.oneof?.name ?? "",
      ]);
    assert.deepEqual(shape(AttachResponseSchema), shape(ChatResponseSchema));
    // The gateway turns an Attach event into a Subscribe event by its tag byte alone.
    const event = SubscribeResponseSchema.fields.find((f) => f.name === "event");
    assert.equal(event?.fieldKind === "message" && event.message.typeName, "troupe.v1.AgentEvent");
    assert.equal(SubscribeResponseSchema.fields.length, 1);
  });

  test("unary round trip with typed request and response", async () => {
    const client = createClient(RouterService, address);
    const res = await client.resolveSession({ sessionId: "s1", agentId: "" });
    assert.equal(res.$typeName, "troupe.v1.ResolveSessionResponse");
    assert.equal(res.sessionKey, "k:s1");
    assert.equal(res.runner?.address, "x:1");
    const list = await client.listRunners({});
    assert.deepEqual(
      list.runners.map((r) => r.runnerId),
      ["a", "b"],
    );
    client.close();
  });

  test("server streaming round trip", async () => {
    const client = createClient(SandboxService, address);
    const out: string[] = [];
    let exit = -1;
    for await (const msg of client.exec({ sessionId: "s", command: "abc" })) {
      if (msg.kind.case === "stdout") out.push(Buffer.from(msg.kind.value).toString());
      if (msg.kind.case === "exit") exit = msg.kind.value.exitCode;
    }
    assert.deepEqual(out, ["a", "b", "c"]);
    assert.equal(exit, 7);
    client.close();
  });

  test("RpcError keeps its status; other errors become INTERNAL without their message", async () => {
    const client = createClient(RouterService, address);
    await assert.rejects(client.resolveSession({ sessionId: "missing" }), {
      code: Status.NOT_FOUND,
      details: "no such session",
    });
    await assert.rejects(client.resolveSession({ sessionId: "boom" }), (err: grpc.ServiceError) => {
      assert.equal(err.code, Status.INTERNAL);
      assert.doesNotMatch(err.details, /secret/);
      return true;
    });
    const sandbox = createClient(SandboxService, address);
    await assert.rejects(sandbox.releaseSandbox({ sessionId: "s" }), { code: Status.FAILED_PRECONDITION });
    sandbox.close();
    client.close();
  });

  test("an unexpected failure is logged through the service's logger, in the call's trace, with its detail", async () => {
    logged.length = 0;
    const client = createClient(RouterService, address);
    const parent = trace.getTracer("test").startSpan("caller");
    await context.with(trace.setSpan(context.active(), parent), () =>
      assert.rejects(client.resolveSession({ sessionId: "boom" }), { code: Status.INTERNAL }),
    );
    parent.end();
    client.close();
    const sandbox = createClient(SandboxService, address);
    await assert.rejects(
      async () => {
        for await (const _ of sandbox.exec({ command: "boom" })) break;
      },
      { code: Status.INTERNAL },
    );
    sandbox.close();
    assert.deepEqual(
      logged.map((l) => l.msg),
      ["troupe.v1.RouterService/ResolveSession failed", "troupe.v1.SandboxService/Exec failed"],
    );
    assert.match(logged[0].error, /secret internal detail/, "the log keeps what the caller is not told");
    assert.match(logged[1].error, /stream internal detail/);
    assert.equal(logged[0].traceId, parent.spanContext().traceId, "the record joins the caller's trace");
    // An RpcError is the handler's answer, not a failure: nothing logged.
    const again = createClient(RouterService, address);
    await assert.rejects(again.resolveSession({ sessionId: "missing" }), { code: Status.NOT_FOUND });
    again.close();
    assert.equal(logged.length, 2);
  });

  test("bytes that do not parse get INVALID_ARGUMENT; oversize gets RESOURCE_EXHAUSTED", async () => {
    const raw = new grpc.Client(address, grpc.credentials.createInsecure());
    const call = (body: Buffer) =>
      new Promise<grpc.ServiceError | null>((resolve) =>
        raw.makeUnaryRequest(
          "/troupe.v1.RouterService/ResolveSession",
          (b: Buffer) => b,
          (b: Buffer) => b,
          body,
          (err) => resolve(err),
        ),
      );
    const bad = await call(Buffer.from([0x0a, 0xff, 0xff, 0xff]));
    assert.equal(bad?.code, Status.INVALID_ARGUMENT);
    assert.match(bad!.details, /malformed troupe\.v1\.ResolveSessionRequest/);
    const big = Buffer.from(
      toBinary(ResolveSessionRequestSchema, create(ResolveSessionRequestSchema, { sessionId: "x".repeat(4000) })),
    );
    assert.equal((await call(big))?.code, Status.RESOURCE_EXHAUSTED);
    raw.close();
  });

  test("unary calls carry a deadline; an aborted signal cancels the call", async () => {
    const client = createClient(RouterService, address);
    const ac = new AbortController();
    ac.abort();
    await assert.rejects(client.resolveSession({ sessionId: "s" }, { signal: ac.signal }), { code: Status.CANCELLED });
    await assert.rejects(client.resolveSession({ sessionId: "s" }, { timeoutMs: 0 }), {
      code: Status.DEADLINE_EXCEEDED,
    });
    client.close();
  });

  test("W3C trace context crosses the call: the server's span joins the client's trace", async () => {
    seenTraceIds = [];
    exporter.reset();
    const client = createClient(RouterService, address);
    const tracer = trace.getTracer("test");
    const parent = tracer.startSpan("caller");
    await context.with(trace.setSpan(context.active(), parent), () => client.resolveSession({ sessionId: "traced" }));
    parent.end();
    client.close();
    const traceId = parent.spanContext().traceId;
    assert.deepEqual(seenTraceIds, [traceId], "the handler ran inside the caller's trace");
    const spans = exporter.getFinishedSpans().filter((s) => s.name === "troupe.v1.RouterService/ResolveSession");
    assert.equal(spans.length, 2, "one client span and one server span");
    for (const s of spans) assert.equal(s.spanContext().traceId, traceId);
    assert.ok(spans.every((s) => s.attributes["rpc.status_code"] === "OK"));
  });

  test("health: SERVING per service, NOT_FOUND for unknown ones, NOT_SERVING once draining", async () => {
    const extra = new RpcServer();
    extra.add(RouterService, {
      resolveSession: async () => ({}),
      registerRunner: async () => ({}),
      listRunners: async () => ({}),
      resolveInbound: async () => ({}),
    });
    const port = await extra.listen("127.0.0.1:0");
    const health = createClient(Health, `127.0.0.1:${port}`);
    assert.equal((await health.check({ service: "" })).status, Serving.SERVING);
    assert.equal((await health.check({ service: "troupe.v1.RouterService" })).status, Serving.SERVING);
    await assert.rejects(health.check({ service: "nope" }), { code: Status.NOT_FOUND });
    const watch = health.watch({ service: "" });
    const statuses: Serving[] = [];
    const ended = new Promise<void>((resolve) => {
      watch.on("data", (r) => statuses.push(r.status));
      watch.on("end", () => resolve());
      watch.on("error", () => resolve());
    });
    await new Promise((r) => setTimeout(r, 100));
    await extra.drain(500);
    await ended;
    health.close();
    assert.deepEqual(statuses, [Serving.SERVING, Serving.NOT_SERVING]);
  });
});
