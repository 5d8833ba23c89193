// RpcServer's way out against a real grpc-js client in-process: a call that ends within drain's
// grace ends as its handler says; calls still running are ended by close() with UNAVAILABLE, so
// their clients retry elsewhere (grpc-js's forceShutdown alone left them open: live-calls.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Status } from "../../services/shared/errors.js";
import { RunnerService } from "../../services/shared/gen/troupe/v1/runner_pb.js";
import { createClient, type grpc, RpcServer } from "../../services/shared/rpc.js";
import type { CallContext } from "../../services/shared/rpc/call-context.js";
import { Channel } from "../../services/shared/rpc/channel.js";

/** A runner whose Attach streams never end by themselves; the number of handlers that began. */
async function endlessRunner() {
  const started = { attach: 0 };
  const server = new RpcServer();
  server.add(RunnerService, {
    attach: (_requests: AsyncIterable<unknown>, ctx: CallContext) => {
      started.attach++;
      // Responses that never come: the call ends only when the server ends it.
      const never = new Channel<never>();
      ctx.signal.addEventListener("abort", () => never.end(), { once: true });
      return never;
    },
  } as never);
  const port = await server.listen("127.0.0.1:0");
  return { server, port, started };
}

/** The status an Attach call ended with, once it ends. */
function ended(call: grpc.ClientDuplexStream<unknown, unknown>): Promise<grpc.StatusObject> {
  return new Promise((resolve) => {
    call.on("data", () => undefined);
    call.on("error", () => undefined);
    call.on("status", resolve);
  });
}

test("close after a drain ends the calls still running with UNAVAILABLE", async () => {
  const { server, port, started } = await endlessRunner();
  const client = createClient(RunnerService, `127.0.0.1:${port}`);
  try {
    const calls = [client.attach(), client.attach(), client.attach()];
    const statuses = calls.map((c) => ended(c as never));
    for (let waited = 0; started.attach < 3 && waited < 2000; waited += 10) await new Promise((r) => setTimeout(r, 10));
    assert.equal(started.attach, 3);
    const t0 = performance.now();
    await server.drain(100);
    await server.close();
    const outcome = await Promise.race([
      Promise.all(statuses),
      new Promise<"still open">((r) => setTimeout(() => r("still open"), 3000)),
    ]);
    assert.notEqual(outcome, "still open", "every call ended once the grace was over");
    for (const status of outcome as grpc.StatusObject[]) {
      assert.equal(status.code, Status.UNAVAILABLE);
      assert.match(status.details, /shutting down/);
    }
    assert.ok(performance.now() - t0 < 2000);
  } finally {
    client.close();
  }
});

test("a call that ends within the grace ends as its handler says", async () => {
  const server = new RpcServer();
  server.add(RunnerService, {
    // Ends 20 ms after its client half-closed.
    attach: async function* (requests: AsyncIterable<unknown>) {
      for await (const _ of requests);
      await new Promise((r) => setTimeout(r, 20));
    },
  } as never);
  const port = await server.listen("127.0.0.1:0");
  const client = createClient(RunnerService, `127.0.0.1:${port}`);
  try {
    const call = client.attach();
    const status = ended(call as never);
    await new Promise((r) => setTimeout(r, 50));
    call.end();
    await server.drain(2000);
    assert.equal((await status).code, Status.OK);
  } finally {
    client.close();
  }
});
