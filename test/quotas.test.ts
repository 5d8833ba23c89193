// Quotas per tenant through the real processes: a quotas file gives each test tenant a small
// quota of one kind, and each test shows the quota refusing with RESOURCE_EXHAUSTED and a retry
// hint (or ending a run with an event saying which quota), while other tenants go on untouched.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { RETRY_AFTER_KEY } from "../services/shared/auth/rate.js";
import { Status } from "../services/shared/errors.js";
import { parseQuotas, DEFAULT_QUOTAS } from "../services/shared/auth/quotas.js";
import { loadConfig } from "../services/shared/config/config.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { Role, StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "./helpers/session.js";
import { exec } from "./helpers/sandbox.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

describe("the quotas file", () => {
  test("defaults, per-tenant values and the environment; a bad file names what is wrong", () => {
    assert.equal(loadConfig([], { TROUPE_QUOTA_CONCURRENT_RUNS: "7" }).quotaDefaults.concurrentRuns, 7);
    assert.equal(loadConfig([], {}).quotaDefaults.liveSandboxes, DEFAULT_QUOTAS.liveSandboxes);
    assert.throws(
      () => loadConfig([], { TROUPE_QUOTA_STEPS_PER_RUN: "0" }),
      /TROUPE_QUOTA_STEPS_PER_RUN must be a positive integer/,
    );
    const f = parseQuotas('{"defaults": {"stepsPerRun": 5}, "tenants": {"acme": {"liveSandboxes": 9}}}', "q.json");
    assert.equal(f.defaults.stepsPerRun, 5);
    assert.equal(f.tenants.get("acme")?.liveSandboxes, 9);
    assert.throws(
      () => parseQuotas('{"defaults": {"stepsPerrun": 5}}', "q.json"),
      /defaults: unknown field stepsPerrun/,
    );
    assert.throws(
      () => parseQuotas('{"tenants": {"a": {"liveSandboxes": -1}}}', "q.json"),
      /tenants\.a\.liveSandboxes must be a positive integer/,
    );
    assert.throws(() => parseQuotas("{", "q.json"), /not JSON/);
  });
});

describe("quotas through the stack", () => {
  let stack: Stack;
  let dataDir: string;
  before(async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-quotas-"));
    await writeFile(
      path.join(dataDir, "quotas.json"),
      JSON.stringify({
        tenants: {
          few: { sessionsPerMinute: 2 },
          runs: { concurrentRuns: 1 },
          steps: { stepsPerRun: 1 },
          tools: { toolCallsPerRun: 2 },
          subs: { subagentsPerRun: 1 },
          aborts: { abortsPerSecond: 1 },
          boxes: { liveSandboxes: 1 },
        },
      }),
    );
    stack = await startStack({ dataDir, env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_CONTEXT_K: "0" } });
  });
  after(async () => {
    await stack?.stop();
    await rm(dataDir, { recursive: true, force: true });
  });

  // The runner's refusal reaches the client through the gateway with its retry hint in the
  // trailer too, where clients look for it, not only in the message.
  const exhausted = (e: { code: number; details: string; metadata?: { get(k: string): unknown[] } }) =>
    e.code === Status.RESOURCE_EXHAUSTED &&
    /retry in \d+ ms/.test(e.details) &&
    Number(e.metadata?.get(RETRY_AFTER_KEY)[0]) > 0;

  test("session creations a minute: the third of 'few' is refused with a retry hint; others go on", async () => {
    const few = await stack.gatewayAs("few", "p");
    await few.createSession({ sessionId: "a" });
    await few.createSession({ sessionId: "b" });
    await assert.rejects(few.createSession({ sessionId: "c" }), exhausted);
    // Opening an existing session is no creation.
    await few.createSession({ sessionId: "a" });
    const other = await stack.gatewayAs("runs", "p");
    for (const id of ["x1", "x2", "x3"]) await other.createSession({ sessionId: id });
    few.close();
    other.close();
  });

  test("runs at once: a second session of 'runs' waits for the first run to end", async () => {
    const runs = await stack.gatewayAs("runs", "q");
    await runs.createSession({ sessionId: "long" });
    await runs.createSession({ sessionId: "next" });
    await runs.sendMessage({ sessionId: "long", frameId: "l1", text: "!tokens 30 rate=20" });
    await assert.rejects(runs.sendMessage({ sessionId: "next", frameId: "n1", text: "hello" }), exhausted);
    // The running session itself still takes messages (they join or queue behind its run).
    await runs.followUp({ sessionId: "long", frameId: "l2", text: "and then" });
    await waitFor(
      "the long run to end",
      async () =>
        (await runs.getHistory({ sessionId: "long" })).messages.filter((m) => m.role === Role.ASSISTANT).length >= 2,
      15_000,
    );
    await runs.sendMessage({ sessionId: "next", frameId: "n2", text: "hello" });
    await waitFor("the next run", async () =>
      (await runs.getHistory({ sessionId: "next" })).messages.some((m) => m.text === "You said: hello"),
    );
    runs.close();
  });

  /** Runs one turn as `client` in a new session and returns its events. */
  async function turn(client: Awaited<ReturnType<Stack["gatewayAs"]>>, sessionId: string, text: string) {
    const s = new ChatSession(client);
    s.send({ case: "open", value: { sessionId, create: true } });
    await s.waitOpened();
    s.prompt(text);
    await s.waitForPayload("agentEnd", 30_000);
    s.close();
    return s.events;
  }

  test("model calls a run: 'steps' ends its run at the quota, with an event saying so", async () => {
    const events = await turn(await stack.gatewayAs("steps", "p"), "s", "!call nosuchtool {}");
    const err = events.find((e) => e.payload.case === "error" && e.payload.value.code === "RUN_QUOTA");
    assert.ok(err, JSON.stringify(events.map((e) => e.payload.case)));
    assert.match(err.payload.case === "error" ? err.payload.value.message : "", /quota of 1 model calls/);
    const end = events.find((e) => e.payload.case === "agentEnd");
    assert.equal(end?.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.ERROR);
  });

  test("tool calls a run: past 'tools' quota the calls are answered, not run", async () => {
    const events = await turn(
      await stack.gatewayAs("tools", "p"),
      "t",
      "!call nosuchtool {} ;; nosuchtool {} ;; nosuchtool {}",
    );
    const results = events.flatMap((e) => (e.payload.case === "toolExecutionEnd" ? [e.payload.value.result] : []));
    assert.equal(results.length, 3);
    assert.doesNotMatch(results[0], /quota/);
    assert.doesNotMatch(results[1], /quota/);
    assert.match(results[2], /reached its quota of tool calls/);
  });

  test("sub-agents a run: the second delegate_task of 'subs' is refused", async () => {
    const events = await turn(
      await stack.gatewayAs("subs", "p"),
      "d",
      '!call delegate_task {"task": "one"} ;; delegate_task {"task": "two"}',
    );
    const results = events.flatMap((e) => (e.payload.case === "toolExecutionEnd" ? [e.payload.value.result] : []));
    assert.equal(results.length, 2, JSON.stringify(results));
    assert.equal(results.filter((r) => /its quota \(subagentsPerRun\)/.test(r)).length, 1, JSON.stringify(results));
  });

  test("aborts a second: a flood of 'aborts' is refused past its quota, and stopping works again after", async () => {
    const a = await stack.gatewayAs("aborts", "p");
    await a.createSession({ sessionId: "ab" });
    let refused = 0;
    for (let i = 0; i < 5; i++)
      await a
        .abort({ sessionId: "ab", frameId: `ab-${i}` })
        .catch((e) => (exhausted(e) ? refused++ : Promise.reject(e)));
    assert.ok(refused >= 2, `${refused} of 5 refused`);
    await new Promise((r) => setTimeout(r, 1100));
    await a.abort({ sessionId: "ab", frameId: "ab-later" });
    a.close();
  });

  test("live sandboxes: 'boxes' gets one; the next is refused until it is released; other tenants are not counted", async () => {
    const boxes = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "boxes", principal: "p" } });
    const other = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "other", principal: "p" } });
    assert.equal((await exec(boxes, "one", "echo 1")).out, "1\n");
    await assert.rejects(exec(boxes, "two", "echo 2"), exhausted);
    assert.equal((await exec(other, "two", "echo 2")).out, "2\n");
    await boxes.releaseSandbox({ sessionId: "one" });
    assert.equal((await exec(boxes, "two", "echo 2")).out, "2\n");
    await boxes.releaseSandbox({ sessionId: "two" });
    await other.releaseSandbox({ sessionId: "two" });
    boxes.close();
    other.close();
  });
});
