// A runner that answers bytes the gateway cannot read, in a session stream (a sub-stream of its
// AttachMany call). The gateway decodes a runner's answer in a stream's data handler, where a
// throw escapes into grpc-js and ends the process: every tenant's streams with it. It must end
// that one stream with INTERNAL and serve on.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import {
  AttachManyRequestSchema,
  ListStoredSessionsResponseSchema,
} from "../services/shared/gen/troupe/v1/runner_pb.js";
import { responseHead } from "../services/shared/sub-streams.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, type Stack } from "./helpers/stack.js";

const { status: Status } = grpc;
const raw = (b: Buffer) => b;

// AttachResponse bytes that do not decode, each where the gateway looks: an `opened` answer
// (field 1) whose length runs past the end, and an event (field 2) holding an agent_start
// (field 10) whose length does too.
const BROKEN: Record<string, Buffer> = {
  "a cut open answer": Buffer.from([0x0a, 0x05, 0x0a]),
  "a cut turn event": Buffer.from([0x12, 0x04, 0x52, 0x09, 0x08, 0x01]),
};

let stack: Stack;
let rogue: grpc.Server;
let rogueAddress = "";
/** What the rogue runner answers to the next stream's first frame. */
let answer: Buffer = Buffer.alloc(0);
/** Session streams (AttachMany sub-streams) the rogue runner was asked for. */
let attaches = 0;
/** The one session the rogue runner's store lists, with events to read. */
const LISTED = Buffer.from(
  toBinary(
    ListStoredSessionsResponseSchema,
    create(ListStoredSessionsResponseSchema, { sessions: [{ sessionId: "s-rogue", agentId: "main", lastSeq: 5n }] }),
  ),
);

before(async () => {
  stack = await startStack({ services: ["router", "gateway"] });
  rogue = new grpc.Server();
  rogue.addService(
    {
      attachMany: {
        path: "/troupe.v1.RunnerService/AttachMany",
        requestStream: true,
        responseStream: true,
        requestSerialize: raw,
        requestDeserialize: raw,
        responseSerialize: raw,
        responseDeserialize: raw,
      },
      listStoredSessions: {
        path: "/troupe.v1.RunnerService/ListStoredSessions",
        requestStream: false,
        responseStream: false,
        requestSerialize: raw,
        requestDeserialize: raw,
        responseSerialize: raw,
        responseDeserialize: raw,
      },
    },
    {
      // Every session stream is a sub-stream of the gateway's AttachMany call: each one's first
      // request is answered with `answer`, as one response item of that sub-stream.
      attachMany: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
        const answered = new Set<number>();
        call.on("error", () => undefined);
        call.on("data", (batch: Buffer) => {
          for (const item of fromBinary(AttachManyRequestSchema, batch).items) {
            if (item.kind.case === "open") attaches++;
            if (item.kind.case !== "request" || answered.has(item.stream)) continue;
            answered.add(item.stream);
            call.write(Buffer.concat([responseHead(item.stream, answer.length), answer]));
          }
        });
      },
      listStoredSessions: (_call: unknown, done: grpc.sendUnaryData<Buffer>) => done(null, LISTED),
    },
  );
  const port = await new Promise<number>((resolve, reject) =>
    rogue.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    ),
  );
  rogueAddress = `127.0.0.1:${port}`;
});
after(async () => {
  rogue?.forceShutdown();
  await stack?.stop();
});

/** Registers the rogue as the router's one runner (again: its lease is short). */
async function registerRogue(): Promise<void> {
  const router = stack.client(RouterService, stack.addr.router);
  try {
    await router.registerRunner({ runner: { runnerId: "rogue", address: rogueAddress } });
  } finally {
    router.close();
  }
}

describe("a runner's answer the gateway cannot read", () => {
  for (const [what, bytes] of Object.entries(BROKEN)) {
    test(`${what}: that stream ends with INTERNAL, and the gateway serves on`, async () => {
      answer = bytes;
      await registerRogue();
      const chat = new ChatSession(stack.gateway);
      chat.open();
      const status = await chat.ended();
      assert.equal(status.code, Status.INTERNAL, `${status.code} ${status.details}`);
      assert.match(status.details, /runner sent a response the gateway cannot read/);
      assert.equal(stack.process("gateway")?.exitCode, null, "the gateway is still running");

      // The next client is served as before: its stream reaches the runner and gets its answer.
      answer = Buffer.from([0x0a, 0x03, 0x12, 0x01, 0x61]); // opened { agent_id: "a" }
      await registerRogue();
      const next = new ChatSession(stack.gateway);
      next.open();
      const opened = await next.waitOpened();
      assert.equal(opened.agentId, "a");
      next.call.end();
    });
  }
});

describe("an inbox whose session's runner answers what the gateway cannot read", () => {
  test("that session's stream is dropped and tried again at the next poll; the inbox and the gateway go on", async () => {
    answer = BROKEN["a cut turn event"]!;
    await registerRogue();
    const before = attaches;
    const inbox = stack.gateway.subscribeInbox({}) as unknown as grpc.ClientReadableStream<unknown>;
    let status: grpc.StatusObject | undefined;
    inbox.on("status", (s: grpc.StatusObject) => (status = s));
    inbox.on("error", () => undefined);
    inbox.on("data", () => undefined);
    // The inbox polls every 2 s: a second attach means the first failure was survived.
    const deadline = Date.now() + 10_000;
    while (attaches < before + 2 && Date.now() < deadline) {
      await registerRogue();
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(attaches >= before + 2, `attached ${attaches - before} times`);
    assert.equal(status, undefined, "the inbox stream is still open");
    assert.equal(stack.process("gateway")?.exitCode, null, "the gateway is still running");
    inbox.cancel();
  });
});
