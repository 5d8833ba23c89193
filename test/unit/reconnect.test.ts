// A client whose server restarted (shared/rpc/client.ts `ready`): grpc-js fails calls at once
// while its channel waits out a reconnect backoff, even once the server is back; `ready` waits for
// the channel instead, within a bound. The gateway waits so before retrying a call to a runner
// that restarted (gateway/server.ts withRunner). Real grpc-js servers in-process, one port.
import { test } from "node:test";
import assert from "node:assert/strict";
import { RunnerService } from "../../services/shared/gen/troupe/v1/runner_pb.js";
import { createClient, RECONNECT_WAIT_MS, RpcServer } from "../../services/shared/rpc.js";
import { grpcCode, Status } from "../../services/shared/errors.js";

const serve = async (address: string) => {
  const server = new RpcServer();
  server.add(RunnerService, { getRunnerStats: async () => ({}) } as never);
  const port = await server.listen(address);
  return { server, port };
};

test("a client waits out its reconnect backoff to a server that came back, and not for ever", async () => {
  const first = await serve("127.0.0.1:0");
  const address = `127.0.0.1:${first.port}`;
  const client = createClient(RunnerService, address, { defaultDeadlineMs: 1000 });
  try {
    await client.getRunnerStats({});
    await first.server.close();
    // Calls while the server is away: each failed connection lengthens the backoff to its cap.
    const until = Date.now() + 3000;
    while (Date.now() < until) {
      const code = await client.getRunnerStats({}).then(
        () => Status.OK,
        (err) => grpcCode(err),
      );
      assert.equal(code, Status.UNAVAILABLE);
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(await client.ready(300), false, "a server that is away: false after the bound");
    const again = await serve(address);
    try {
      const started = Date.now();
      assert.equal(await client.ready(RECONNECT_WAIT_MS), true, "connected within the longest backoff");
      assert.ok(Date.now() - started <= RECONNECT_WAIT_MS + 200);
      await client.getRunnerStats({});
    } finally {
      await again.server.close();
    }
  } finally {
    client.close();
  }
});
