// Streaming handlers as iterables (rpc/call-context.ts, rpc/channel.ts), against a real grpc-js
// server and client in this process: responses taken only as the stream has room, a failure's
// status after the responses before it, a client leaving seen by the handler, ctx.fail ending a
// stream that is full; and the channel's own contract.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { RpcError, Status, resourceExhausted } from "../../services/shared/errors.js";
import { RunnerService, type AttachRequest } from "../../services/shared/gen/troupe/v1/runner_pb.js";
import { SandboxService, type ExecRequest } from "../../services/shared/gen/troupe/v1/sandbox_pb.js";
import { createClient, type grpc, RpcServer, type ServiceClient } from "../../services/shared/rpc.js";
import type { CallContext } from "../../services/shared/rpc/call-context.js";
import { byteLength, Channel } from "../../services/shared/rpc/channel.js";
import { eventBytes } from "../helpers/event-bytes.js";

/** Responses a flooding handler offers: far more than the stream's windows hold. */
const FLOOD = 20_000;

/** What the running test's handler saw. */
const seen = {
  produced: 0,
  finallyRan: false,
  aborted: false,
  frameIds: [] as string[],
  failAt: 0,
};

let server: RpcServer;
let runner: ServiceClient<(typeof RunnerService)["method"]>;
let sandbox: ServiceClient<(typeof SandboxService)["method"]>;

before(async () => {
  // Unexpected failures are logged: here, kept.
  const quiet = () => undefined;
  server = new RpcServer({ logger: { debug: quiet, info: quiet, warn: quiet, error: quiet } });
  server.add(RunnerService, {
    // The first frame's id says what the handler does.
    attach: (requests: AsyncIterable<AttachRequest>, ctx: CallContext) => {
      ctx.signal.addEventListener("abort", () => (seen.aborted = true), { once: true });
      return script(requests, ctx);
    },
  } as never);
  server.add(SandboxService, {
    // Server streaming: three outputs, then the failure the command names.
    async *exec(req: ExecRequest) {
      for (let i = 0; i < 3; i++) yield { kind: { case: "stdout", value: Buffer.from(`${i}`) } };
      if (req.command === "moved") throw new RpcError(Status.FAILED_PRECONDITION, "moved on");
      throw new Error("a secret detail");
    },
  } as never);
  const port = await server.listen("127.0.0.1:0");
  runner = createClient(RunnerService, `127.0.0.1:${port}`, { rawResponses: ["attach"] });
  sandbox = createClient(SandboxService, `127.0.0.1:${port}`);
});
after(async () => {
  runner.close();
  sandbox.close();
  await server.drain(0);
  await server.close();
});

function script(
  requests: AsyncIterable<AttachRequest>,
  ctx: CallContext,
): AsyncIterable<Uint8Array> | Channel<Uint8Array> {
  const it = requests[Symbol.asyncIterator]();
  const out = new Channel<Uint8Array>();
  void (async () => {
    const first = await it.next();
    const what = first.done ? "" : (first.value.frame?.frameId ?? "");
    if (what === "echo") {
      // One response per request, in order, until the client half-closes.
      let seq = 0;
      for (let r = await it.next(); !r.done; r = await it.next()) {
        seen.frameIds.push(r.value.frame?.frameId ?? "");
        out.push(eventBytes(++seq));
      }
      out.end();
    } else if (what === "flood") {
      // As many as the stream takes; held back by room() as a session's events are.
      try {
        for (let i = 1; i <= FLOOD && !out.closed; i++) {
          seen.produced = i;
          if (!out.push(eventBytes(i, 1000))) await out.room();
        }
        out.end();
      } finally {
        seen.finallyRan = true;
      }
    } else if (what === "fail") {
      // Pushes until full, then ends the call at once with RESOURCE_EXHAUSTED.
      for (let i = 1; i <= 2000; i++) out.push(eventBytes(i, 10_000));
      seen.produced = 2000;
      setTimeout(() => {
        seen.failAt = seen.produced;
        ctx.fail(resourceExhausted("this stream stopped reading"));
      }, 100);
    }
  })();
  return out;
}

/** Opens an Attach call whose first frame says what the handler does; collects what comes back. */
function attach(what: string) {
  const call = runner.attach();
  const got = { seqs: [] as number[], status: undefined as grpc.StatusObject | undefined };
  const ended = new Promise<grpc.StatusObject>((resolve) => {
    call.on("error", () => undefined);
    call.on("status", (s: grpc.StatusObject) => {
      got.status = s;
      resolve(s);
    });
  });
  call.on("data", () => got.seqs.push(got.seqs.length + 1));
  call.write({ frame: { frameId: what } });
  return { call, got, ended };
}

const reset = () => Object.assign(seen, { produced: 0, finallyRan: false, aborted: false, frameIds: [], failAt: 0 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("a streaming handler as iterables", () => {
  test("requests come in order, a half-close ends them, and the call ends OK with the responses", async () => {
    reset();
    const { call, got, ended } = attach("echo");
    for (let i = 0; i < 50; i++) call.write({ frame: { frameId: `f${i}` } });
    call.end();
    const status = await ended;
    assert.equal(status.code, Status.OK);
    assert.deepEqual(
      seen.frameIds,
      Array.from({ length: 50 }, (_, i) => `f${i}`),
    );
    assert.equal(got.seqs.length, 50);
    assert.ok(seen.aborted, "the signal says the call is over once it ended");
  });

  test("responses are taken only as the stream has room: a client that does not read holds its handler", async () => {
    reset();
    const { call, got, ended } = attach("flood");
    call.pause();
    await sleep(300);
    const held = seen.produced;
    assert.ok(held > 0 && held < FLOOD, `the handler was held back (${held} of ${FLOOD})`);
    assert.deepEqual(got.seqs, []);
    call.resume();
    call.end();
    assert.equal((await ended).code, Status.OK);
    assert.equal(got.seqs.length, FLOOD, "every response arrived once the client read");
  });

  test("a client that leaves aborts the signal and ends the handler where it waits", async () => {
    reset();
    const { call, ended } = attach("flood");
    call.pause();
    await sleep(200);
    call.cancel();
    assert.equal((await ended).code, Status.CANCELLED);
    for (let waited = 0; !seen.finallyRan && waited < 2000; waited += 10) await sleep(10);
    assert.ok(seen.aborted, "the handler's signal aborted");
    assert.ok(seen.finallyRan, "the handler's wait for room ended with the call");
  });

  test("ctx.fail ends a stream that is full at once, with its status", async () => {
    reset();
    const { call, got, ended } = attach("fail");
    call.pause();
    for (let waited = 0; seen.failAt === 0 && waited < 2000; waited += 10) await sleep(10);
    assert.ok(seen.aborted, "the call was over on the server's side at once");
    call.resume();
    const status = await ended;
    assert.equal(status.code, Status.RESOURCE_EXHAUSTED);
    assert.match(status.details, /stopped reading/);
    assert.ok(got.seqs.length < seen.failAt, "what was still queued was dropped");
  });

  test("a failure after some responses: those arrive, then the status; an unexpected one says nothing of itself", async () => {
    for (const [command, code, details] of [
      ["moved", Status.FAILED_PRECONDITION, /moved on/],
      ["boom", Status.INTERNAL, /^(?!.*secret)/],
    ] as const) {
      const call = sandbox.exec({ command });
      const outputs: string[] = [];
      const status = await new Promise<grpc.StatusObject>((resolve) => {
        call.on("data", (r: { kind: { value: Uint8Array } }) => outputs.push(Buffer.from(r.kind.value).toString()));
        call.on("error", () => undefined);
        call.on("status", resolve);
      });
      assert.deepEqual(outputs, ["0", "1", "2"], command);
      assert.equal(status.code, code, command);
      assert.match(status.details, details);
    }
  });
});

describe("Channel", () => {
  test("push says when it reaches its mark; room resolves once the reader took it below", async () => {
    const ch = new Channel<number>(3);
    assert.equal(ch.push(1), true);
    assert.equal(ch.push(2), true);
    assert.equal(ch.push(3), false);
    let roomy = false;
    void ch.room()!.then(() => (roomy = true));
    await sleep(0);
    assert.equal(roomy, false);
    assert.deepEqual(await ch.next(), { value: 1, done: false });
    await sleep(0);
    assert.equal(roomy, true);
    assert.equal(ch.room(), undefined);
  });

  test("weighed in bytes, it is full once the bytes queued reach the mark, whatever their count", async () => {
    const ch = new Channel<Uint8Array>(1000, byteLength);
    assert.equal(ch.push(new Uint8Array(600)), true);
    assert.equal(ch.push(new Uint8Array(600)), false, "two items, 1,200 bytes: full");
    await ch.next();
    assert.equal(ch.room(), undefined, "600 bytes left: room again");
    const small = new Channel<Uint8Array>(1000, byteLength);
    for (let i = 0; i < 99; i++)
      assert.equal(small.push(new Uint8Array(10)), true, "99 small items are under the mark");
  });

  test("end: what is queued is read first; end(err) then throws err once; pushes after are dropped", async () => {
    const ch = new Channel<number>();
    ch.push(1);
    ch.push(2);
    ch.end(new Error("moved"));
    ch.push(3);
    assert.deepEqual(await ch.next(), { value: 1, done: false });
    assert.deepEqual(await ch.next(), { value: 2, done: false });
    await assert.rejects(ch.next(), /moved/);
    assert.deepEqual(await ch.next(), { value: undefined, done: true });
  });

  test("fail: at once, what is queued is dropped, a waiting reader gets the error", async () => {
    const ch = new Channel<number>();
    ch.push(1);
    ch.fail(new Error("cut"));
    await assert.rejects(ch.next(), /cut/);
    const waiting = new Channel<number>();
    const read = waiting.next();
    waiting.fail(new Error("cut too"));
    await assert.rejects(read, /cut too/);
  });

  test("sunk: items are written as pushed; past a full writer they wait for flush; the end comes after them", async () => {
    const ch = new Channel<number>(3);
    const written: number[] = [];
    let room = true;
    const sunk = ch.sinkTo((n) => (written.push(n), room));
    ch.push(1);
    assert.deepEqual(written, [1], "written at once, in the push");
    room = false;
    ch.push(2);
    assert.deepEqual(written, [1, 2], "taken by a writer that then said it is full");
    assert.equal(ch.push(3), true);
    assert.equal(ch.push(4), true);
    assert.equal(ch.push(5), false, "three waiting behind the full writer: at the mark");
    assert.deepEqual(written, [1, 2]);
    ch.end(new Error("moved"));
    room = true;
    ch.flush();
    assert.deepEqual(written, [1, 2, 3, 4, 5]);
    await assert.rejects(sunk, /moved/, "the end, after what was queued");
    const failing = new Channel<number>();
    const failed = failing.sinkTo(() => false);
    failing.push(1);
    failing.push(2);
    failing.fail(new Error("cut"));
    await assert.rejects(failed, /cut/);
  });

  test("a reader that leaves ends it: a waiting producer goes on, later pushes are dropped", async () => {
    const ch = new Channel<number>(1);
    ch.push(1);
    const room = ch.room()!;
    for await (const n of ch) {
      assert.equal(n, 1);
      break;
    }
    await room;
    assert.equal(ch.closed, true);
    assert.equal(ch.size, 0);
    ch.push(2);
    assert.equal(ch.size, 0);
  });
});
