// Sandboxes shared beyond one session: scope "agent" (one sandbox per agent of a tenant) and
// "shared" (one per tenant), and the runner's file tools running in the session's sandbox.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../services/shared/errors.js";
import { scopeKey } from "../services/sandbox/scope.js";
import { failsWith } from "./helpers/sandbox.js";
import { ChatSession } from "./helpers/session.js";
import { startStack } from "./helpers/stack.js";

describe("sandbox scopes agent and shared", () => {
  test("sessions of one agent share a sandbox; another agent's sessions, or another tenant's, do not see it", async () => {
    const stack = await startStack({
      services: ["sandbox"],
      env: { TROUPE_SANDBOX_SCOPE: "agent", TROUPE_SANDBOX_POOL: "0" },
    });
    const sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
    const stranger = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "other", principal: "dev" } });
    try {
      await sandbox.writeFile({
        sessionId: "s1",
        agentId: "writer",
        path: "notes",
        data: Buffer.from("shared within writer"),
      });
      assert.equal(
        Buffer.from((await sandbox.readFile({ sessionId: "s2", agentId: "writer", path: "notes" })).data).toString(),
        "shared within writer",
      );
      await failsWith(sandbox.readFile({ sessionId: "s1", agentId: "other", path: "notes" }), Status.NOT_FOUND);
      await failsWith(stranger.readFile({ sessionId: "s1", agentId: "writer", path: "notes" }), Status.NOT_FOUND);
      await failsWith(
        sandbox.readFile({ sessionId: "s1", agentId: "Bad Agent!", path: "notes" }),
        Status.INVALID_ARGUMENT,
      );
      // A call that names no owner is refused: every sandbox belongs to a tenant.
      const anonymous = stack.client(SandboxService, stack.addr.sandbox);
      await failsWith(
        anonymous.readFile({ sessionId: "s1", agentId: "writer", path: "notes" }),
        Status.UNAUTHENTICATED,
      );
      anonymous.close();
      const keys = (await sandbox.listSandboxes({})).sandboxes.map((s) => s.scopeKey).sort();
      assert.deepEqual(
        keys,
        [
          scopeKey("agent", DEV_IDENTITY, "", "other"),
          scopeKey("agent", DEV_IDENTITY, "", "writer"),
          scopeKey("agent", { tenant: "other", principal: "dev" }, "", "writer"),
        ].sort(),
      );
      for (const c of [sandbox, stranger])
        for (const agentId of ["writer", "other"]) await c.releaseSandbox({ sessionId: "s9", agentId });
    } finally {
      sandbox.close();
      stranger.close();
      await stack.stop();
    }
  });

  test("the shared scope is one sandbox per tenant, never one for all", async () => {
    const stack = await startStack({
      services: ["sandbox"],
      env: { TROUPE_SANDBOX_SCOPE: "shared", TROUPE_SANDBOX_POOL: "0" },
    });
    const a = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "acme", principal: "alice" } });
    const a2 = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "acme", principal: "bob" } });
    const b = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "evil", principal: "alice" } });
    try {
      await a.writeFile({ sessionId: "s1", path: "tenant-note", data: Buffer.from("acme only") });
      assert.equal(
        Buffer.from((await a2.readFile({ sessionId: "s7", path: "tenant-note" })).data).toString(),
        "acme only",
      );
      await failsWith(b.readFile({ sessionId: "s1", path: "tenant-note" }), Status.NOT_FOUND);
      for (const c of [a, b]) await c.releaseSandbox({ sessionId: "s1" });
    } finally {
      for (const c of [a, a2, b]) c.close();
      await stack.stop();
    }
  });
});

describe("the runner's file tools", () => {
  test("write_file, read_file and list_files run in the session's sandbox; refusals reach the model", async () => {
    const stack = await startStack();
    const s = new ChatSession(stack.gateway);
    try {
      s.open();
      await s.waitOpened();
      const results: string[] = [];
      for (const prompt of [
        '!call write_file {"path": "notes/todo.txt", "content": "buy milk"}',
        '!call read_file {"path": "notes/todo.txt"}',
        '!call list_files {"path": "notes"}',
        '!call read_file {"path": "../../etc/passwd"}',
        '!call read_file {"path": "missing.txt"}',
        "$ cat notes/todo.txt",
      ]) {
        const from = s.events.length;
        s.prompt(prompt);
        const toolEnd = await s.waitForPayload("toolExecutionEnd", 20_000, from);
        const end = await s.waitForPayload("agentEnd", 20_000, from);
        assert.ok(end.payload.case === "agentEnd" && end.payload.value.stopReason === StopReason.COMPLETED, prompt);
        assert.ok(toolEnd.payload.case === "toolExecutionEnd");
        results.push(`${toolEnd.payload.value.isError ? "ERR" : "OK"} ${toolEnd.payload.value.result}`);
      }
      assert.equal(results[0], "OK wrote 8 bytes to notes/todo.txt");
      assert.equal(results[1], "OK buy milk");
      assert.match(results[2], /^OK file\t8\ttodo\.txt$/);
      assert.match(results[3], /^ERR read_file failed: path must not contain `\.\.`/);
      assert.match(results[4], /^ERR read_file failed: .*no such file/);
      assert.match(results[5], /^OK buy milk\n\[exit 0\]$/);
    } finally {
      s.close();
      await stack.stop();
    }
  });
});
