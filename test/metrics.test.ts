// Metrics as Prometheus scrapes them: each service started with --metrics serves /metrics on its
// own port, and after a turn with a tool call and a failed turn the figures say what happened:
// RPCs by method and status, runs by phase (failed by error code), model calls with their tokens
// and time to first chunk, tool calls by tool and outcome, sandboxed commands, sandboxes, memory
// searches, session-log appends, mailboxes, and tokens and tool time per tenant.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { freePort, MAIN, startStack, type ServiceName, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
const SERVICES = ["router", "memory", "sandbox", "runner", "gateway"] as const satisfies readonly ServiceName[];
let stack: Stack;
const metricsAddr = {} as Record<(typeof SERVICES)[number], string>;

before(async () => {
  stack = await startStack({ services: ["model-server"], env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" } });
  for (const name of SERVICES) {
    metricsAddr[name] = `127.0.0.1:${await freePort()}`;
    await stack.startInstance(name, name, { addr: stack.addr[name], args: ["--metrics", metricsAddr[name]] });
  }
});
after(async () => {
  await stack?.stop();
});

/** One scrape: each sample line as [name, labels, value]. */
async function scrape(name: (typeof SERVICES)[number]) {
  const res = await fetch(`http://${metricsAddr[name]}/metrics`);
  assert.equal(res.status, 200);
  const text = await res.text();
  const samples = text
    .split("\n")
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => {
      const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)/.exec(l)!;
      const labels = Object.fromEntries(
        [...(m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]),
      );
      return { name: m[1], labels, value: Number(m[3]) };
    });
  /** The sum of the samples named `metric` whose labels include `where`. */
  const sum = (metric: string, where: Record<string, string> = {}) =>
    samples
      .filter((s) => s.name === metric && Object.entries(where).every(([k, v]) => s.labels[k] === v))
      .reduce((n, s) => n + s.value, 0);
  return { text, sum };
}

async function waitForTurn(sessionId: string, count: number) {
  for (let i = 0; i < 300; i++) {
    const { messages } = await stack.gateway.getHistory({ sessionId });
    if (messages.filter((m) => m.role === Role.ASSISTANT && m.stopReason !== 2).length >= count) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`no answer in session ${sessionId}`);
}

describe("metrics on /metrics", () => {
  before(async () => {
    const s = (await stack.gateway.createSession({})).session!.sessionId;
    await stack.gateway.sendMessage({ sessionId: s, frameId: "m1", text: "$ echo measured" });
    await waitForTurn(s, 1);
    const f = (await stack.gateway.createSession({})).session!.sessionId;
    await stack.gateway.sendMessage({ sessionId: f, frameId: "m2", text: "!fail 400" });
    for (let i = 0; i < 100; i++) {
      if ((await scrape("runner")).sum("troupe_turns_total", { troupe_turn_phase: "failed" }) > 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
  });

  test("the runner counts runs, model calls, tokens, tool calls, appends and mailboxes", async () => {
    const { sum, text } = await scrape("runner");
    assert.ok(sum("troupe_turns_total", { troupe_turn_phase: "started", tenant: "local" }) >= 2, text);
    assert.ok(sum("troupe_turns_total", { troupe_turn_phase: "completed" }) >= 1);
    assert.ok(sum("troupe_turns_total", { troupe_turn_phase: "failed", error_type: "MODEL_ERROR" }) >= 1);
    const chat = { gen_ai_operation_name: "chat", gen_ai_request_model: "scripted-1" };
    assert.ok(sum("gen_ai_client_operation_duration_count", chat) >= 3, "two calls for the tool turn, one failed");
    assert.ok(sum("gen_ai_client_operation_duration_count", { ...chat, error_type: "400" }) >= 1);
    assert.ok(sum("gen_ai_client_operation_time_to_first_chunk_count", chat) >= 2);
    assert.ok(sum("gen_ai_client_token_usage_sum", { gen_ai_token_type: "output" }) > 0);
    assert.ok(sum("troupe_tool_duration_count", { gen_ai_tool_name: "exec", troupe_tool_outcome: "ok" }) >= 1);
    assert.ok(sum("troupe_tenant_tokens_total", { tenant: "local", gen_ai_token_type: "input" }) > 0);
    assert.ok(sum("troupe_tenant_tool_time_total", { tenant: "local" }) > 0);
    assert.ok(sum("troupe_store_append_duration_count", { troupe_store: "files" }) > 0);
    assert.match(text, /^troupe_mailbox_depth(\{[^}]*\})? 0$/m);
    assert.ok(sum("troupe_sessions_live") >= 2);
    assert.match(text, /^troupe_learning_waiting(\{[^}]*\})? \d+$/m);
    assert.match(text, /^troupe_learning_dropped_total(\{[^}]*\})? 0$/m);
    assert.ok(sum("rpc_server_call_duration_count", { rpc_method: "troupe.v1.RunnerService/Submit" }) >= 2);
  });

  test("the gateway and router count their calls by method and status", async () => {
    const gateway = await scrape("gateway");
    const ok = { rpc_method: "troupe.v1.GatewayService/SendMessage", rpc_response_status_code: "OK" };
    assert.ok(gateway.sum("rpc_server_call_duration_count", ok) >= 2, gateway.text);
    await assert.rejects(stack.gateway.getHistory({ sessionId: "no-such-session" }));
    const after = await scrape("gateway");
    assert.ok(
      after.sum("rpc_server_call_duration_count", {
        rpc_method: "troupe.v1.GatewayService/GetHistory",
        rpc_response_status_code: "NOT_FOUND",
      }) >= 1,
    );
    const router = await scrape("router");
    assert.ok(
      router.sum("rpc_server_call_duration_count", { rpc_method: "troupe.v1.RouterService/ResolveSession" }) >= 1,
    );
  });

  test("the sandbox counts commands and sandboxes; memory its searches", async () => {
    const sandbox = await scrape("sandbox");
    assert.ok(sandbox.sum("troupe_sandbox_exec_duration_count", { troupe_exec_outcome: "ok" }) >= 1, sandbox.text);
    assert.ok(sandbox.sum("troupe_sandboxes", { troupe_sandbox_state: "claimed" }) >= 1);
    const memory = await scrape("memory");
    assert.ok(memory.sum("troupe_memory_search_duration_count") >= 1, memory.text);
  });
});

test("an address without a port stops the start, saying so", async () => {
  const failed = await run(process.execPath, [MAIN, "router", "--router", "127.0.0.1:0", "--metrics", "127.0.0.1:0"], {
    timeout: 20_000,
  }).catch((e) => e);
  assert.equal(failed.code, 1);
  assert.match(failed.stderr, /TROUPE_METRICS_ADDR 127\.0\.0\.1:0: name a port/);
});
