// What a misbehaving client gets: a clear status, and a gateway that keeps serving everyone else.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "./helpers/session.js";
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { startStack, type Stack } from "./helpers/stack.js";

const { status: Status } = grpc;
let stack: Stack;
let raw: grpc.Client;

before(async () => {
  stack = await startStack({ env: { TROUPE_MAX_MESSAGE_BYTES: String(64 * 1024) } });
  // Quick retries, so a failing model gives up in milliseconds rather than seconds.
  await mkdir(path.join(stack.dataDir, "agents", "main"), { recursive: true });
  await writeFile(
    path.join(stack.dataDir, "agents", "main", "agent.json"),
    JSON.stringify({ retry: { maxRetries: 2, baseDelayMs: 20 } }),
  );
  raw = new grpc.Client(stack.addr.gateway, grpc.credentials.createInsecure());
});
after(async () => {
  raw?.close();
  await stack?.stop();
});

const identity = (b: Buffer) => b;
const GARBAGE = Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f]);

/** The stack's development key, as a raw grpc-js client must send it. */
function authorized(): grpc.Metadata {
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${stack.apiKey}`);
  return md;
}

function rawUnary(method: string, body: Buffer): Promise<grpc.ServiceError | null> {
  return new Promise((resolve) =>
    raw.makeUnaryRequest(method, identity, identity, body, authorized(), (err) => resolve(err)),
  );
}

function rawChat(frames: Buffer[]): Promise<grpc.StatusObject> {
  return new Promise((resolve) => {
    const call = raw.makeBidiStreamRequest("/troupe.v1.GatewayService/Chat", identity, identity, authorized());
    call.on("data", () => undefined);
    call.on("error", () => undefined);
    call.on("status", resolve);
    for (const f of frames) call.write(f);
  });
}

async function statusOf(s: ChatSession): Promise<grpc.StatusObject> {
  const st = await s.ended();
  s.close();
  return st;
}

/** A fresh session still gets a complete reply: the service kept serving. */
async function assertStillServing(): Promise<void> {
  const s = new ChatSession(stack.gateway);
  s.open();
  await s.waitOpened();
  s.prompt("still there?");
  const end = await s.waitForPayload("agentEnd");
  s.close();
  assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED);
}

describe("bad input at the gateway", () => {
  test("bytes that are not a protobuf message: INVALID_ARGUMENT, on streams and unary calls", async () => {
    const st = await rawChat([GARBAGE]);
    assert.equal(st.code, Status.INVALID_ARGUMENT, st.details);
    assert.match(st.details, /malformed troupe\.v1\.ChatRequest/);
    const err = await rawUnary("/troupe.v1.GatewayService/SendMessage", GARBAGE);
    assert.equal(err?.code, Status.INVALID_ARGUMENT);
    await assertStillServing();
  });

  test("a frame with no kind or no frame id: INVALID_ARGUMENT", async () => {
    const s = new ChatSession(stack.gateway);
    s.call.write({ frame: { frameId: "x1" } });
    const st = await statusOf(s);
    assert.equal(st.code, Status.INVALID_ARGUMENT);
    assert.match(st.details, /no kind/);

    const s2 = new ChatSession(stack.gateway);
    s2.call.write({ frame: { frameId: "", kind: { case: "open", value: {} } } });
    assert.equal((await statusOf(s2)).code, Status.INVALID_ARGUMENT);

    const s3 = new ChatSession(stack.gateway);
    s3.open();
    await s3.waitOpened();
    s3.prompt("   ");
    const st3 = await statusOf(s3);
    assert.equal(st3.code, Status.INVALID_ARGUMENT);
    assert.match(st3.details, /text must not be empty/);
  });

  test("a frame before the session is opened: FAILED_PRECONDITION", async () => {
    const s = new ChatSession(stack.gateway);
    s.prompt("hello?");
    const st = await statusOf(s);
    assert.equal(st.code, Status.FAILED_PRECONDITION);
    assert.match(st.details, /before the session was opened/);
    const s2 = new ChatSession(stack.gateway);
    s2.open();
    await s2.waitOpened();
    s2.open();
    assert.equal((await statusOf(s2)).code, Status.FAILED_PRECONDITION);
  });

  test("an unknown session: NOT_FOUND on open, send and history", async () => {
    const s = new ChatSession(stack.gateway);
    s.open("no-such-session", false);
    const st = await statusOf(s);
    assert.equal(st.code, Status.NOT_FOUND);
    assert.match(st.details, /no-such-session does not exist/);
    await assert.rejects(stack.gateway.sendMessage({ sessionId: "no-such-session", frameId: "a", text: "hi" }), {
      code: Status.NOT_FOUND,
    });
    await assert.rejects(stack.gateway.getHistory({ sessionId: "no-such-session" }), { code: Status.NOT_FOUND });
  });

  test("ids that could escape the data directory: INVALID_ARGUMENT", async () => {
    for (const sessionId of ["../etc/passwd", "a/b", "x".repeat(200), "bad id"]) {
      await assert.rejects(
        stack.gateway.sendMessage({ sessionId, frameId: "a", text: "hi" }),
        { code: Status.INVALID_ARGUMENT },
        sessionId,
      );
    }
    await assert.rejects(stack.gateway.createSession({ sessionId: "ok", agentId: "Not Valid" }), {
      code: Status.INVALID_ARGUMENT,
    });
  });

  test("a page size out of range or a page token not issued: INVALID_ARGUMENT, from every paged method", async () => {
    const bad = { code: Status.INVALID_ARGUMENT };
    await assert.rejects(stack.gateway.getHistory({ sessionId: "x", pageSize: -1 }), bad);
    await assert.rejects(stack.gateway.getHistory({ sessionId: "x", pageToken: "1e3" }), bad);
    await assert.rejects(stack.gateway.listSessions({ pageSize: 1001 }), bad);
    await assert.rejects(stack.gateway.listSessions({ pageToken: "-5" }), bad);
  });

  test("a message over the configured size: RESOURCE_EXHAUSTED, and the stream's session survives", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    const opened = await s.waitOpened();
    s.prompt("x".repeat(100 * 1024));
    const st = await statusOf(s);
    assert.equal(st.code, Status.RESOURCE_EXHAUSTED);
    await assert.rejects(
      stack.gateway.sendMessage({ sessionId: opened.sessionId, frameId: "big", text: "y".repeat(100 * 1024) }),
      {
        code: Status.RESOURCE_EXHAUSTED,
      },
    );
    // The same session is still usable from a new stream.
    const again = new ChatSession(stack.gateway);
    again.open(opened.sessionId, false);
    await again.waitOpened();
    again.prompt("small");
    const end = await again.waitForPayload("agentEnd");
    again.close();
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED);
  });

  test("a failing model ends the run with an error event, and the session keeps working", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    s.prompt("!fail 500");
    const err = await s.waitForPayload("error");
    const end = await s.waitForPayload("agentEnd");
    assert.ok(err.payload.case === "error" && err.payload.value.code === "MODEL_ERROR" && err.payload.value.retryable);
    // Retried twice (agent.json) before it gave up; each retry was an event.
    const retries = s.events.filter((e) => e.payload.case === "modelRetry");
    assert.deepEqual(
      retries.map((e) =>
        e.payload.case === "modelRetry" ? [e.payload.value.attempt, e.payload.value.httpStatus] : [],
      ),
      [
        [1, 500],
        [2, 500],
      ],
    );
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.ERROR);
    assert.match(end.payload.value.errorMessage, /500/);
    const from = s.events.length;
    s.prompt("and now?");
    const end2 = await s.waitForPayload("agentEnd", 10_000, from);
    s.close();
    assert.ok(end2.payload.case === "agentEnd" && end2.payload.value.stopReason === StopReason.COMPLETED);
  });

  test("a model stream cut mid-way is an error, not a hang", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    s.prompt("!cut 3");
    const end = await s.waitForPayload("agentEnd", 10_000);
    s.close();
    assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.ERROR);
  });

  test("a failing command, an unknown tool and malformed arguments become error results the model sees", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    await s.waitOpened();
    const results: string[] = [];
    for (const prompt of [
      "$ exit 3",
      "!call nope {}",
      '!call exec {"command": "echo',
      "!call exec [1,2]",
      '!call exec {"command": 42}',
    ]) {
      const from = s.events.length;
      s.prompt(prompt);
      const toolEnd = await s.waitForPayload("toolExecutionEnd", 15_000, from);
      const end = await s.waitForPayload("agentEnd", 15_000, from);
      assert.ok(toolEnd.payload.case === "toolExecutionEnd" && toolEnd.payload.value.isError, prompt);
      assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED, prompt);
      results.push(toolEnd.payload.value.result);
    }
    s.close();
    assert.match(results[0], /\[exit 3\]/);
    assert.match(
      results[1],
      /^Tool nope not found\. Available tools: exec, read_file, write_file, list_files, process, memory_search, memory_save, memory_forget, web_fetch, manage_schedule, delegate_task\.$/,
    );
    assert.match(results[2], /^Invalid JSON in the arguments of exec/);
    assert.match(results[3], /must be a JSON object/);
    // Checked against the tool's JSON schema before the tool runs.
    assert.match(results[4], /^The arguments of exec do not match its schema:\n- \/command: must be string/);
  });
});
