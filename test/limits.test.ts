// Per-tenant and per-session limits at the gateway: token buckets for messages (never for
// aborts), a cap on open streams, RESOURCE_EXHAUSTED with a retry hint, and nothing accepted lost.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { ErrorInfoSchema, RetryInfoSchema } from "../services/shared/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../services/shared/gen/google/rpc/status_pb.js";
import { SendMessageRequestSchema, SendMessageResponseSchema } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { GatewayLimits, RETRY_AFTER_KEY } from "../services/gateway/limits.js";
import { Status } from "../services/shared/errors.js";
import type { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import type { ServiceClient } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

describe("the buckets (a clock of our own)", () => {
  test("a burst, then the rate; a refusal says how long to wait and costs nothing", () => {
    let now = 0;
    const limits = new GatewayLimits(
      { tenantRate: 100, tenantBurst: 100, sessionRate: 2, sessionBurst: 3, tenantStreams: 2 },
      () => now,
    );
    for (let i = 0; i < 3; i++) limits.admitMessage("t", "s");
    assert.throws(
      () => limits.admitMessage("t", "s"),
      (err: { code: number; retryAfterMs: number }) =>
        err.code === Status.RESOURCE_EXHAUSTED && err.retryAfterMs === 500,
    );
    limits.admitMessage("t", "other-session");
    now += 500;
    limits.admitMessage("t", "s");
    assert.throws(() => limits.admitMessage("t", "s"));
    // The tenant's bucket was not drawn by the refusals: 3 + 1 + 1 = 5 of 100 used.
    const release = limits.openStream("t");
    limits.openStream("t");
    assert.throws(() => limits.openStream("t"), { code: Status.RESOURCE_EXHAUSTED });
    release();
    release();
    limits.openStream("t");
    limits.stop();
  });
});

describe("limits through the gateway", () => {
  let stack: Stack;
  let alice: ServiceClient<(typeof GatewayService)["method"]>;
  let bob: ServiceClient<(typeof GatewayService)["method"]>;
  before(async () => {
    stack = await startStack({
      services: ["model-server", "router", "runner", "gateway"],
      env: {
        TROUPE_MEMORY_CONTEXT_K: "0",
        TROUPE_SESSION_RATE: "1",
        TROUPE_SESSION_BURST: "3",
        TROUPE_TENANT_RATE: "2",
        TROUPE_TENANT_BURST: "5",
        TROUPE_TENANT_STREAMS: "3",
      },
    });
    alice = await stack.gatewayAs("acme", "alice");
    bob = await stack.gatewayAs("other", "bob");
  });
  after(async () => {
    alice?.close();
    bob?.close();
    await stack?.stop();
  });

  test("unary messages over a session's budget: RESOURCE_EXHAUSTED with retry-after-ms; aborts pass; other tenants unaffected", async () => {
    const send = (client: typeof alice, sessionId: string, n: number) =>
      client.sendMessage({ sessionId, frameId: `${sessionId}-${n}`, text: `!tokens 2` });
    await alice.createSession({ sessionId: "lim-1" });
    await bob.createSession({ sessionId: "lim-b" });
    for (let i = 0; i < 3; i++) await send(alice, "lim-1", i);
    let trailers: grpc.Metadata | undefined;
    await assert.rejects(send(alice, "lim-1", 3), (err: grpc.ServiceError) => {
      assert.equal(err.code, Status.RESOURCE_EXHAUSTED);
      assert.match(err.details, /session lim-1 is over its limit of 1 messages\/s; retry in \d+ ms/);
      trailers = err.metadata;
      return true;
    });
    const wait = Number(trailers?.get(RETRY_AFTER_KEY)[0]);
    assert.ok(wait > 0 && wait <= 1000, `retry-after-ms ${wait}`);
    await alice.abort({ sessionId: "lim-1", frameId: "lim-1-abort" });
    await send(bob, "lim-b", 0);
    await new Promise((r) => setTimeout(r, wait + 50));
    await send(alice, "lim-1", 4);
    // Everything accepted reached the session; the refused message did not.
    const ids = await waitFor("the accepted messages to run", async () => {
      const h = (await alice.getHistory({ sessionId: "lim-1" })).messages
        .filter((m) => m.role === Role.USER)
        .map((m) => m.frameId);
      return h.includes("lim-1-4") && h;
    });
    assert.deepEqual([...ids].sort(), ["lim-1-0", "lim-1-1", "lim-1-2", "lim-1-4"]);
  });

  test("the wait, as gRPC clients read it: grpc-js's retry policy waits the pushback; RetryInfo and ErrorInfo", async () => {
    await alice.createSession({ sessionId: "lim-retry" });
    // grpc-js's own client and retry policy (gRPC A6), no Troupe code: a refusal's
    // grpc-retry-pushback-ms says when to try again, in place of the policy's 10 ms backoff.
    const serviceConfig = {
      methodConfig: [
        {
          name: [{ service: "troupe.v1.GatewayService" }],
          retryPolicy: {
            maxAttempts: 5,
            initialBackoff: "0.01s",
            maxBackoff: "0.01s",
            backoffMultiplier: 1,
            retryableStatusCodes: ["RESOURCE_EXHAUSTED"],
          },
        },
      ],
    };
    const raw = new grpc.Client(stack.addr.gateway, grpc.credentials.createInsecure(), {
      "grpc.service_config": JSON.stringify(serviceConfig),
    });
    const key = await stack.keyFor("acme", "alice");
    const send = (n: number) =>
      new Promise<{ ms: number }>((resolve, reject) => {
        const metadata = new grpc.Metadata();
        metadata.set("authorization", `Bearer ${key}`);
        const started = Date.now();
        raw.makeUnaryRequest(
          "/troupe.v1.GatewayService/SendMessage",
          (r: { sessionId: string; frameId: string; text: string }) =>
            Buffer.from(toBinary(SendMessageRequestSchema, create(SendMessageRequestSchema, r))),
          (b: Buffer) => fromBinary(SendMessageResponseSchema, b),
          { sessionId: "lim-retry", frameId: `lim-retry-${n}`, text: "!tokens 1" },
          metadata,
          (err) => (err ? reject(err) : resolve({ ms: Date.now() - started })),
        );
      });
    // The session's burst (3), then one a second: the fourth is refused, waits its pushback
    // (about 1 s; the policy alone would give up after 5 x 10 ms), and is taken.
    for (let i = 0; i < 3; i++) await send(i);
    const fourth = await send(3);
    assert.ok(fourth.ms >= 500, `the retry waited ${fourth.ms} ms`);
    raw.close();
    // The refusal itself, as google.rpc.Status details.
    let trailers: grpc.Metadata | undefined;
    await assert.rejects(
      Promise.all(
        [0, 1, 2, 3].map((i) =>
          alice.sendMessage({ sessionId: "lim-retry", frameId: `lim-retry-x${i}`, text: "!tokens 1" }),
        ),
      ),
      (err: grpc.ServiceError) => {
        trailers = err.metadata;
        return err.code === Status.RESOURCE_EXHAUSTED;
      },
    );
    const pushback = Number(trailers?.get("grpc-retry-pushback-ms")[0]);
    assert.ok(pushback > 0 && pushback <= 1000, `pushback ${pushback}`);
    const status = fromBinary(StatusSchema, trailers?.get("grpc-status-details-bin")[0] as Buffer);
    assert.equal(status.code, Status.RESOURCE_EXHAUSTED);
    const retry = status.details.map((d) => anyUnpack(d, RetryInfoSchema)).find(Boolean);
    const info = status.details.map((d) => anyUnpack(d, ErrorInfoSchema)).find(Boolean);
    const delayMs = Number(retry?.retryDelay?.seconds ?? 0n) * 1000 + (retry?.retryDelay?.nanos ?? 0) / 1e6;
    assert.equal(delayMs, pushback);
    assert.equal(info?.reason, "RATE_LIMITED");
    assert.equal(info?.domain, "troupe.v1");
  });

  test("a tenant's open streams are capped; a closed one frees its place", async () => {
    const open = async (id: string) => {
      const s = new ChatSession(alice);
      s.send({ case: "open", value: { sessionId: id, create: true } });
      return s;
    };
    const streams = [await open("st-1"), await open("st-2"), await open("st-3")];
    for (const s of streams) await s.waitOpened();
    const fourth = await open("st-4");
    const status = await fourth.ended();
    assert.equal(status.code, Status.RESOURCE_EXHAUSTED);
    assert.match(status.details, /3 streams open/);
    // Another tenant is not counted against alice's cap.
    const b = new ChatSession(bob);
    b.send({ case: "open", value: { sessionId: "st-b", create: true } });
    await b.waitOpened();
    await streams[0].finish();
    const again = await open("st-4");
    await again.waitOpened();
    for (const s of [...streams.slice(1), again, b]) await s.finish();
  });
});
