// A client in another language: examples/python/troupe_client.py (Debian's grpcio, stubs from
// proto/ made by `make python-client`) against a live stack. It authenticates, runs a turn with a
// tool call, steers and aborts, and checks every answer itself; here we check it said so.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { startStack, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const GEN = `${ROOT}.gen/python`;

let stack: Stack;
before(async () => {
  stack = await startStack({ env: { TROUPE_MEMORY_CONTEXT_K: "0" } });
});
after(async () => {
  await stack?.stop();
});

test("the Python client authenticates, streams a turn with a tool call, steers and aborts", {
  timeout: 120_000,
}, async () => {
  assert.ok(
    existsSync(`${GEN}/troupe/v1/gateway_pb2_grpc.py`),
    "stubs missing: run `make python-client` (make test does)",
  );
  const { stdout } = await run(
    "/usr/bin/python3",
    [`${ROOT}examples/python/troupe_client.py`, "--gateway", stack.addr.gateway, "--session", "py-1"],
    {
      env: { ...process.env, PYTHONPATH: GEN, TROUPE_API_KEY: stack.apiKey },
      timeout: 100_000,
    },
  ).catch((err: { stdout?: string; stderr?: string; message: string }) => {
    throw new Error(
      `python client failed: ${err.message}\n${err.stdout ?? ""}\n${err.stderr ?? ""}\n--- stack ---\n${stack.logs().slice(-3000)}`,
    );
  });
  assert.match(stdout, /unknown key: UNAUTHENTICATED/);
  assert.match(stdout, /turn with a tool call: \d+ events, tool said 'hello from python'/);
  assert.match(stdout, /steering: 2 tool calls skipped, steer applied/);
  assert.match(stdout, /abort while streaming: the run ended with stop reason aborted/);
  assert.match(stdout, /^OK$/m);
  // What the Python client did is in the session, seen through the TypeScript client too.
  const history = await stack.gateway.getHistory({ sessionId: "py-1" });
  assert.ok(history.messages.some((m) => m.text === "$ echo hello from python"));
  assert.ok(history.messages.some((m) => m.text === "stop, do something else"));
});
