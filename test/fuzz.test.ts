// Fuzzing the gateway: thousands of malformed, truncated, mutated and oversized messages on the
// Chat stream and on unary calls, from an authenticated client. Every one must end with a clean
// status (never INTERNAL, UNKNOWN or a dropped connection), and a real session must keep working
// through it all.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { create, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { Status } from "../services/shared/errors.js";
import { ChatRequestSchema, SendMessageRequestSchema } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, type Stack } from "./helpers/stack.js";

const CASES = Number(process.env.FUZZ_CASES ?? 3000);
const MAX_MESSAGE_BYTES = 256 * 1024;
// What a bad message may get. OK: a mutation can still be a valid message (an open that creates a session).
const CLEAN = new Set([
  Status.OK,
  Status.INVALID_ARGUMENT,
  Status.NOT_FOUND,
  Status.FAILED_PRECONDITION,
  Status.RESOURCE_EXHAUSTED,
  Status.PERMISSION_DENIED,
]);

let stack: Stack;
before(async () => {
  stack = await startStack({
    services: ["model-server", "router", "runner", "gateway"],
    env: {
      TROUPE_MEMORY_CONTEXT_K: "0",
      TROUPE_MAX_MESSAGE_BYTES: String(MAX_MESSAGE_BYTES),
      TROUPE_SESSION_RATE: "1000",
      TROUPE_SESSION_BURST: "1000",
    },
  });
});
after(async () => {
  await stack?.stop();
});

function rng(seed: number) {
  let s = seed >>> 0;
  return () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
}

/** Deterministic bad inputs: valid encodings cut, flipped, spliced; noise; oversized bodies. */
function payloads(n: number, rand: () => number): { kind: string; chat: boolean; body: Buffer }[] {
  const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)];
  const valid = [
    toBinary(
      ChatRequestSchema,
      create(ChatRequestSchema, {
        frame: { frameId: "f1", kind: { case: "open", value: { sessionId: "fuzz-s", create: true } } },
      }),
    ),
    toBinary(
      ChatRequestSchema,
      create(ChatRequestSchema, { frame: { frameId: "f2", kind: { case: "prompt", value: { text: "hello" } } } }),
    ),
    toBinary(
      ChatRequestSchema,
      create(ChatRequestSchema, { frame: { frameId: "f3", kind: { case: "abort", value: { reason: "x" } } } }),
    ),
    toBinary(
      SendMessageRequestSchema,
      create(SendMessageRequestSchema, { sessionId: "fuzz-unknown", frameId: "u1", text: "hi" }),
    ),
  ];
  const out: { kind: string; chat: boolean; body: Buffer }[] = [];
  for (let i = 0; i < n; i++) {
    const chat = rand() < 0.7;
    const base = Buffer.from(pick(valid));
    const r = rand();
    let kind: string;
    let body: Buffer;
    if (r < 0.25) {
      kind = "truncated";
      body = base.subarray(0, Math.floor(rand() * base.length));
    } else if (r < 0.5) {
      kind = "bit flips";
      body = Buffer.from(base);
      for (let k = 0; k < 1 + Math.floor(rand() * 4); k++)
        body[Math.floor(rand() * body.length)] ^= 1 << Math.floor(rand() * 8);
    } else if (r < 0.7) {
      kind = "noise";
      body = Buffer.from(Array.from({ length: Math.floor(rand() * 200) }, () => Math.floor(rand() * 256)));
    } else if (r < 0.85) {
      kind = "wrong field types";
      // Field numbers of the real messages with wire types and lengths that do not fit.
      body = Buffer.from([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, ...base.subarray(0, 8)]);
      body[1 + Math.floor(rand() * 3)] = Math.floor(rand() * 256);
    } else if (r < 0.99) {
      kind = "spliced";
      body = Buffer.concat([
        base.subarray(0, Math.floor(rand() * base.length)),
        Buffer.from(pick(valid)).subarray(Math.floor(rand() * 4)),
      ]);
    } else {
      kind = "oversized";
      body = Buffer.alloc(MAX_MESSAGE_BYTES + 1 + Math.floor(rand() * 1000), 0x41);
    }
    out.push({ kind, chat, body });
  }
  return out;
}

test(`${CASES} malformed, truncated and oversized messages each get a clean status while a real session keeps working`, {
  timeout: 300_000,
}, async () => {
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${stack.apiKey}`);
  const raw = new grpc.Client(stack.addr.gateway, grpc.credentials.createInsecure(), {
    "grpc.max_send_message_length": -1,
  });
  const same = (b: Buffer) => b;
  const sendOne = (p: { chat: boolean; body: Buffer }) =>
    new Promise<number>((resolve) => {
      if (!p.chat) {
        raw.makeUnaryRequest(
          "/troupe.v1.GatewayService/SendMessage",
          same,
          same,
          p.body,
          md,
          { deadline: Date.now() + 20_000 },
          (err) => resolve(err ? err.code : Status.OK),
        );
        return;
      }
      const call = raw.makeBidiStreamRequest("/troupe.v1.GatewayService/Chat", same, same, md, {
        deadline: Date.now() + 20_000,
      });
      call.on("data", () => undefined);
      call.on("error", () => undefined);
      call.on("status", (s: grpc.StatusObject) => resolve(s.code));
      call.write(p.body);
      call.end();
    });

  // The real session, meanwhile: one turn after another until the fuzzing is done.
  const real = new ChatSession(stack.gateway);
  real.send({ case: "open", value: { sessionId: "fuzz-real", create: true } });
  await real.waitOpened();
  let fuzzing = true;
  let turns = 0;
  const conversation = (async () => {
    while (fuzzing || turns < 3) {
      const from = real.events.length;
      real.prompt(`turn ${turns}`);
      await real.waitFor((e) => e.payload.case === "agentEnd", 30_000, from);
      turns++;
    }
  })();

  const counts = new Map<string, number>();
  const bad: string[] = [];
  const all = payloads(CASES, rng(7));
  for (let i = 0; i < all.length; i += 50) {
    const batch = all.slice(i, i + 50);
    const codes = await Promise.all(batch.map(sendOne));
    codes.forEach((code, j) => {
      const key = `${batch[j].kind} -> ${Status[code]}`;
      counts.set(key, (counts.get(key) ?? 0) + 1);
      if (!CLEAN.has(code))
        bad.push(
          `${batch[j].chat ? "Chat" : "SendMessage"} ${batch[j].kind} (${batch[j].body.length} bytes): ${Status[code]}`,
        );
    });
  }
  fuzzing = false;
  await conversation;
  raw.close();
  await real.finish();

  assert.deepEqual(
    bad.slice(0, 10),
    [],
    `every bad message gets a clean status; got: ${[...counts].map(([k, v]) => `${k}: ${v}`).join(", ")}`,
  );
  assert.ok(
    (counts.get("oversized -> RESOURCE_EXHAUSTED") ?? 0) > 0 || !all.some((p) => p.kind === "oversized"),
    "oversized messages are RESOURCE_EXHAUSTED",
  );
  assert.ok(
    [...counts.keys()].some((k) => k.endsWith("INVALID_ARGUMENT")),
    "malformed messages are INVALID_ARGUMENT",
  );
  assert.ok(turns >= 3, `the real session kept working (${turns} turns)`);
  // The real session's history is whole: every turn's prompt and answer.
  const history = await stack.gateway.getHistory({ sessionId: "fuzz-real", pageSize: 1000 });
  assert.equal(history.messages.length, turns * 2);
  assert.ok(stack.process("gateway")?.exitCode === null, "the gateway is still running");
});
