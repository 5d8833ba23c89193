// AttachMany between a real grpc-js server and client in this process: the runner's side
// (attach-many.ts) handing sub-streams to an Attach handler, the gateway's (runner-mux.ts)
// standing in for Attach calls. The Attach handler here is a small script: each prompt frame's
// text says what it does ("tokens N SIZE", "fail", "big"). And the wire format of the responses,
// written by hand (sub-streams.ts), against protobuf-es.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { attachManyHandler, SUB_STREAM_WINDOW } from "../../services/runner/transport/attach-many.js";
import type { RunnerCall } from "../../services/gateway/passthrough.js";
import { RunnerMux } from "../../services/gateway/runner-mux.js";
import { RpcError, SESSION_OWNER_KEY, Status } from "../../services/shared/errors.js";
import {
  AttachManyResponseSchema,
  AttachResponseSchema,
  RunnerService,
  type AttachManyRequest,
  type AttachRequest,
} from "../../services/shared/gen/troupe/v1/runner_pb.js";
import { createLogger } from "../../services/shared/process/log.js";
import { createClient, grpc, RpcServer, wrappedHandler } from "../../services/shared/rpc.js";
import type { CallContext } from "../../services/shared/rpc/call-context.js";
import { serviceDefinition } from "../../services/shared/rpc/definition.js";
import { endItem, readBatch, responseHead } from "../../services/shared/sub-streams.js";
import { eventBytes } from "../helpers/event-bytes.js";

const logger = createLogger("runner", "error", "json");

interface Seen {
  attachCalls: number;
  attachManyCalls: number;
  /** Sub-streams whose handler saw its call end before its responses did (the gateway cancelled). */
  cancelled: number;
  /** Events each prompt's handler produced, by the prompt's text. */
  yielded: Map<string, number>;
  /** AttachMany calls whose handler saw its call end. */
  manyEnded: number;
  /** The caller each handler's call metadata named (CALLER_KEY), in the order the handlers began. */
  callers: string[];
}

/** A metadata entry the gateway's caller sets, which its handler must see. */
const CALLER_KEY = "x-test-caller";

/** As a runner refuses a session that lives elsewhere: ABORTED, with the owner in the trailers. */
class Moved extends RpcError {
  constructor() {
    super(Status.ABORTED, "the session moved");
  }
  override get trailers() {
    return { [SESSION_OWNER_KEY]: "10.0.0.9:50053" };
  }
}

/** The scripted Attach handler: opened on the first frame, then what each prompt says. */
function scriptedAttach(seen: Seen) {
  return async function* (requests: AsyncIterable<AttachRequest>, ctx: CallContext) {
    seen.callers.push(String(ctx.metadata.get(CALLER_KEY)[0] ?? ""));
    let finished = false;
    ctx.signal.addEventListener("abort", () => finished || seen.cancelled++, { once: true });
    let first = true;
    // As the runner: the stream ends once the client half-closed and the session is idle.
    for await (const req of requests) {
      if (first) {
        first = false;
        yield create(AttachResponseSchema, { kind: { case: "opened", value: { sessionId: "s" } } });
        continue;
      }
      const kind = req.frame?.kind;
      const text = kind?.case === "prompt" ? kind.value.text : "";
      const [what, n, size] = text.split(" ");
      if (what === "fail") {
        finished = true;
        throw new Moved();
      }
      if (what === "big") yield eventBytes(1, Number(n));
      else if (what === "tokens") {
        for (let i = 1; i <= Number(n); i++) {
          seen.yielded.set(text, i);
          yield eventBytes(i, Number(size ?? 0));
        }
      }
    }
    finished = true;
  };
}

async function startRunner(options: { maxMessageBytes?: number; withoutAttachMany?: boolean } = {}) {
  const seen: Seen = {
    attachCalls: 0,
    attachManyCalls: 0,
    cancelled: 0,
    manyEnded: 0,
    yielded: new Map(),
    callers: [],
  };
  const script = scriptedAttach(seen);
  const attach = (requests: AsyncIterable<AttachRequest>, ctx: CallContext) => {
    seen.attachCalls++;
    return script(requests, ctx);
  };
  const max = options.maxMessageBytes ?? 4 * 1024 * 1024;
  let port: number;
  let stop: () => void;
  if (options.withoutAttachMany) {
    // An older runner: grpc-js answers UNIMPLEMENTED for a method it was not given.
    const server = new grpc.Server();
    server.addService(
      { attach: serviceDefinition(RunnerService).attach },
      { attach: wrappedHandler(RunnerService.method.attach, attach as never) },
    );
    port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) =>
        err ? reject(err) : resolve(p),
      ),
    );
    stop = () => server.forceShutdown();
  } else {
    const many = attachManyHandler(wrappedHandler(RunnerService.method.attach, script as never) as never, logger, max);
    const server = new RpcServer({ maxMessageBytes: max });
    server.add(RunnerService, {
      attach,
      attachMany: (requests: AsyncIterable<AttachManyRequest>, ctx: CallContext) => {
        seen.attachManyCalls++;
        ctx.signal.addEventListener("abort", () => seen.manyEnded++, { once: true });
        return many(requests, ctx);
      },
    } as never);
    port = await server.listen("127.0.0.1:0");
    stop = () => void server.drain(0);
  }
  const client = createClient(RunnerService, `127.0.0.1:${port}`, { rawResponses: ["attach", "attachMany"] });
  const mux = new RunnerMux(client);
  // As the gateway's RunnerPool.close: the call ends first, so the connection can close.
  return { seen, mux, stop: () => (mux.close(), client.close(), stop()) };
}

interface Received {
  seqs: number[];
  opened: boolean;
  error?: grpc.ServiceError;
  ended: Promise<void>;
}

/** Opens a sub-stream, sends the open frame and `prompt`, and half-closes; collects what comes back. */
function session(mux: RunnerMux, prompt: string, paused = false, caller = ""): { call: RunnerCall; got: Received } {
  const metadata = new grpc.Metadata();
  if (caller) metadata.set(CALLER_KEY, caller);
  const call = mux.attach(metadata);
  const got = { seqs: [] as number[], opened: false } as Received;
  got.ended = new Promise<void>((resolve) => {
    call.on("end", () => resolve());
    call.on("error", (err: grpc.ServiceError) => {
      got.error = err;
      resolve();
    });
  });
  if (paused) call.pause();
  call.on("data", (bytes: Buffer) => {
    const resp = fromAttach(bytes);
    if (resp.kind.case === "opened") got.opened = true;
    else if (resp.kind.case === "event") got.seqs.push(Number(resp.kind.value.seq));
  });
  call.write({ frame: { frameId: "o", kind: { case: "open", value: { create: true } } } });
  call.write({ frame: { frameId: "p", kind: { case: "prompt", value: { text: prompt } } } });
  call.end();
  return { call, got };
}

/** Starts a session that would stream for ever, cuts it by `cut` once it streams: it ends CANCELLED. */
async function cutWhileStreaming(mux: RunnerMux, cut: (endless: ReturnType<typeof session>) => void) {
  const endless = session(mux, "tokens 100000000 100");
  await new Promise((r) => setTimeout(r, 100));
  cut(endless);
  await endless.got.ended;
  assert.equal(endless.got.error?.code, Status.CANCELLED);
}

/** A whole response item, as the runner's outbox writes it: the head, then the response. */
const responseItem = (stream: number, response: Uint8Array) =>
  Buffer.concat([responseHead(stream, response.length), response]);
const fromAttach = (bytes: Buffer) => fromBinary(AttachResponseSchema, bytes);
const oneTo = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

describe("AttachMany", () => {
  test("many sessions' streams share one call, each in its own order", async () => {
    const runner = await startRunner();
    try {
      const sessions = Array.from({ length: 20 }, (_, i) => session(runner.mux, "tokens 50", false, `caller-${i}`));
      await Promise.all(sessions.map((s) => s.got.ended));
      // Each handler got its own caller's metadata, carried in its sub-stream's open.
      assert.deepEqual([...runner.seen.callers].sort(), sessions.map((_, i) => `caller-${i}`).sort());
      for (const { got } of sessions) {
        assert.equal(got.error, undefined);
        assert.ok(got.opened);
        assert.deepEqual(got.seqs, oneTo(50));
      }
      assert.equal(runner.seen.attachManyCalls, 1);
      assert.equal(runner.seen.attachCalls, 0);
    } finally {
      runner.stop();
    }
  });

  test("a sub-stream's failure ends it alone, with its code and trailers", async () => {
    const runner = await startRunner();
    try {
      const failing = session(runner.mux, "fail");
      const other = session(runner.mux, "tokens 30");
      await Promise.all([failing.got.ended, other.got.ended]);
      assert.equal(failing.got.error?.code, Status.ABORTED);
      assert.equal(failing.got.error?.details, "the session moved");
      assert.deepEqual(failing.got.error?.metadata.get(SESSION_OWNER_KEY), ["10.0.0.9:50053"]);
      assert.equal(other.got.error, undefined);
      assert.deepEqual(other.got.seqs, oneTo(30));
    } finally {
      runner.stop();
    }
  });

  test("a response over the message limit fails its own sub-stream, not the call", async () => {
    const runner = await startRunner({ maxMessageBytes: 64 * 1024 });
    try {
      // Many small responses add up past the limit within one turn of the loop: sent in parts.
      const others = Array.from({ length: 10 }, () => session(runner.mux, "tokens 200 500"));
      const big = session(runner.mux, "big 100000");
      await Promise.all([big.got.ended, ...others.map((s) => s.got.ended)]);
      assert.equal(big.got.error?.code, Status.RESOURCE_EXHAUSTED);
      for (const { got } of others) {
        assert.equal(got.error, undefined);
        assert.deepEqual(got.seqs, oneTo(200));
      }
    } finally {
      runner.stop();
    }
  });

  test("a paused sub-stream holds its runner to the window while the others flow", async () => {
    const runner = await startRunner();
    try {
      const count = Math.ceil((3 * SUB_STREAM_WINDOW) / 1000);
      const slow = session(runner.mux, `tokens ${count} 1000`, true);
      const fast = session(runner.mux, "tokens 100");
      await fast.got.ended;
      assert.deepEqual(fast.got.seqs, oneTo(100));
      await new Promise((r) => setTimeout(r, 200));
      const held = runner.seen.yielded.get(`tokens ${count} 1000`) ?? 0;
      assert.ok(held > 0 && held < count, `the paused stream's handler was held back (${held} of ${count})`);
      assert.deepEqual(slow.got.seqs, [], "nothing is handed on while paused");
      slow.call.resume();
      await slow.got.ended;
      assert.equal(slow.got.error, undefined);
      assert.deepEqual(slow.got.seqs, oneTo(count));
    } finally {
      runner.stop();
    }
  });

  test("a cancelled sub-stream stops its handler; the call serves the others on", async () => {
    const runner = await startRunner();
    try {
      await cutWhileStreaming(runner.mux, (endless) => endless.call.cancel());
      const after = session(runner.mux, "tokens 40");
      await after.got.ended;
      assert.equal(after.got.error, undefined);
      assert.deepEqual(after.got.seqs, oneTo(40));
      assert.equal(runner.seen.cancelled, 1, "the runner's handler was told");
      assert.equal(runner.seen.attachManyCalls, 1);
    } finally {
      runner.stop();
    }
  });

  test("closing the mux ends its call: the runner lets go of it and of its sub-streams", async () => {
    const runner = await startRunner();
    try {
      await cutWhileStreaming(runner.mux, () => runner.mux.close());
      for (let waited = 0; runner.seen.manyEnded === 0 && waited < 2000; waited += 10)
        await new Promise((r) => setTimeout(r, 10));
      assert.equal(runner.seen.manyEnded, 1, "the runner saw its AttachMany call end");
      assert.equal(runner.seen.cancelled, 1, "the sub-stream's handler was told");
      // A stream attached after the close goes on a call of its own.
      const later = session(runner.mux, "tokens 10");
      await later.got.ended;
      assert.deepEqual(later.got.seqs, oneTo(10));
      assert.equal(runner.seen.attachManyCalls, 2);
    } finally {
      runner.stop();
    }
  });

  test("a runner without AttachMany: its streams end UNIMPLEMENTED, none falls back to Attach", async () => {
    const runner = await startRunner({ withoutAttachMany: true });
    try {
      const first = session(runner.mux, "tokens 20");
      const second = session(runner.mux, "tokens 20");
      await Promise.all([first.got.ended, second.got.ended]);
      for (const { got } of [first, second]) {
        assert.equal(got.error?.code, Status.UNIMPLEMENTED);
        assert.deepEqual(got.seqs, []);
      }
      // The next stream asks for AttachMany again, not for Attach.
      const later = session(runner.mux, "tokens 5");
      await later.got.ended;
      assert.equal(later.got.error?.code, Status.UNIMPLEMENTED);
      assert.equal(runner.seen.attachCalls, 0);
    } finally {
      runner.stop();
    }
  });
});

describe("AttachManyResponse by hand", () => {
  test("a response item is the bytes protobuf-es writes, and reads back as a view", () => {
    for (const stream of [0, 1, 127, 128, 300_000, 0xfffffff0]) {
      for (const response of [new Uint8Array(), eventBytes(5), eventBytes(9, 200)]) {
        const mine = responseItem(stream, response);
        const theirs = toBinary(
          AttachManyResponseSchema,
          create(AttachManyResponseSchema, { items: [{ stream, kind: { case: "response", value: response } }] }),
        );
        assert.deepEqual(new Uint8Array(mine), theirs);
      }
    }
  });

  test("a batch reads back item by item, in order, ends with their status", () => {
    const batch = Buffer.concat([
      responseItem(3, eventBytes(1)),
      endItem(4, Status.ABORTED, "moved", { [SESSION_OWNER_KEY]: "x:1" }),
      responseItem(3, eventBytes(2)),
      endItem(3, 0, ""),
    ]);
    const seen: string[] = [];
    readBatch(batch, {
      response: (s, bytes) => {
        const resp = fromAttach(bytes);
        seen.push(`${s}:${resp.kind.case === "event" ? Number(resp.kind.value.seq) : resp.kind.case}`);
      },
      end: (s, status) =>
        seen.push(`${s}:end ${status.code} ${status.details} ${status.trailers[SESSION_OWNER_KEY] ?? ""}`),
    });
    assert.deepEqual(seen, ["3:1", "4:end 10 moved x:1", "3:2", "3:end 0  "]);
  });

  test("bytes that are not such a message are refused, not half read", () => {
    const whole = responseItem(1, eventBytes(1, 50));
    for (const bad of [whole.subarray(0, whole.length - 3), Buffer.from([0x0a, 0xff]), Buffer.from([0x0b])])
      assert.throws(() => readBatch(bad, { response: () => undefined, end: () => undefined }));
  });
});
