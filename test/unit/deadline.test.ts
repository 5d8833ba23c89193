// Deadline propagation through Troupe's RPC client (shared/rpc/client.ts): a call made for a call
// being served (`parent`) ends no later than that call's deadline, as gRPC's propagation has it,
// and is cancelled when it is. Two real grpc-js servers in-process: the front one calls the back
// one for each call it serves (collect_garbage stands for "propagate"); the back one reports
// the deadline it was given.
import { test } from "node:test";
import assert from "node:assert/strict";
import { RunnerService } from "../../services/shared/gen/troupe/v1/runner_pb.js";
import type { grpc } from "../../services/shared/rpc.js";
import { createClient, RpcServer } from "../../services/shared/rpc.js";

test("a downstream call carries the caller's deadline, not its own default", async () => {
  const seen: number[] = [];
  const back = new RpcServer();
  back.add(RunnerService, {
    async getRunnerStats(_req: unknown, call: grpc.ServerUnaryCall<unknown, unknown>) {
      seen.push(Number(call.getDeadline()));
      return {};
    },
  } as never);
  const backPort = await back.listen("127.0.0.1:0");
  const backClient = createClient(RunnerService, `127.0.0.1:${backPort}`, { defaultDeadlineMs: 60_000 });
  const front = new RpcServer();
  front.add(RunnerService, {
    async getRunnerStats(req: { collectGarbage: boolean }, call: grpc.ServerUnaryCall<unknown, unknown>) {
      // With the parent, the earlier of the two deadlines; without, the client's own 60 s.
      return backClient.getRunnerStats(req, req.collectGarbage ? { parent: call } : {});
    },
  } as never);
  const frontPort = await front.listen("127.0.0.1:0");
  const caller = createClient(RunnerService, `127.0.0.1:${frontPort}`);
  try {
    const before = Date.now();
    await caller.getRunnerStats({ collectGarbage: true }, { timeoutMs: 2000 });
    await caller.getRunnerStats({ collectGarbage: false }, { timeoutMs: 2000 });
    assert.equal(seen.length, 2);
    assert.ok(seen[0] <= before + 2000 + 50, `propagated: the caller's 2 s (${seen[0] - before} ms)`);
    assert.ok(seen[1] >= before + 50_000, `not propagated: the client's 60 s (${seen[1] - before} ms)`);
  } finally {
    caller.close();
    backClient.close();
    await front.close();
    await back.close();
  }
});
