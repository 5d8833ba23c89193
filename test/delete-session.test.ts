// Sessions have an end: DeleteSession removes a session's log, schedules, sandbox and workspace,
// its memories only when asked; only its owner can, and to anyone else it does not exist.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, utimes, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { sessionLogPath } from "../services/runner/store/jsonl-session-store.js";
import { refOf } from "../services/shared/session-ref.js";
import { Status } from "../services/shared/errors.js";
import { CONVERSATION_SESSION_PREFIX } from "../services/shared/ids.js";
import { MemoryService } from "../services/shared/gen/troupe/v1/memory_pb.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { scopeKey } from "../services/sandbox/scope.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";
import { endOf } from "./helpers/turn-stack.js";

let stack: Stack;
let dataDir: string;
before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-delete-"));
  await mkdir(path.join(dataDir, "agents", "brief"), { recursive: true });
  await writeFile(path.join(dataDir, "agents", "brief", "agent.json"), JSON.stringify({ retentionDays: 1 }));
  // The runner dies half-way through deleting session cut-killed, as in a crash.
  stack = await startStack({
    dataDir,
    env: { TROUPE_RETENTION_SWEEP_MS: "300", TROUPE_FAILPOINTS: "runner.delete=cut-killed!crash" },
  });
});
after(async () => {
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

/** Runs `texts` in session `id` (of `agentId`), one turn each. */
async function converse(id: string, ...texts: string[]): Promise<void> {
  return converseWith("", id, ...texts);
}
async function converseWith(agentId: string, id: string, ...texts: string[]): Promise<void> {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { sessionId: id, agentId, create: true } });
  await s.waitOpened();
  for (const t of texts) assert.ok(endOf(await s.turn(t, 30_000)));
  s.close();
}

/** The development principal's memories of `text` learned in any session. */
async function memoriesOf(query: string) {
  const memory = stack.client(MemoryService, stack.addr.memory);
  try {
    const res = await memory.searchMemories({ scope: { tenant: "local", owner: "dev" }, query, k: 20 });
    return res.results.map((r) => ({ text: r.memory?.text ?? "", session: r.memory?.sessionId ?? "" }));
  } finally {
    memory.close();
  }
}

/**
 * Session `id` with two sub-agent sessions: one that ran a command in its sandbox, one that saved
 * a memory. Returns their ids.
 */
async function withChildren(id: string): Promise<{ parent: string; children: string[] }> {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { sessionId: id, create: true } });
  await s.waitOpened();
  const children: string[] = [];
  for (const task of [
    '!call exec {"command": "echo child > /workspace/c.txt"}',
    '!call memory_save {"text": "the heron nests by the pier"}',
  ]) {
    const events = await s.turn(`!call delegate_task ${JSON.stringify({ task })}`, 30_000);
    const started = /sub-agent session (\S+) started/.exec(
      events.flatMap((e) => (e.payload.case === "toolExecutionUpdate" ? [e.payload.value.output] : [])).join(""),
    );
    assert.ok(started, "a child was started");
    children.push(started[1]);
  }
  s.close();
  return { parent: id, children };
}

const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => Status.OK,
    (e: { code?: number }) => e.code,
  );

describe("DeleteSession", () => {
  test("removes the log, schedules and sandbox; keeps memories; to another principal it does not exist", async () => {
    await converse("doomed", "$ echo kept > /workspace/f.txt", "remember that my locker code is 4412.");
    await stack.gateway.createSchedule({
      schedule: { sessionId: "doomed", scheduleId: "daily", when: { case: "cron", value: "0 3 * * *" }, text: "hi" },
    });
    await waitFor("the fact learned", async () =>
      (await memoriesOf("locker code")).some((m) => m.session === "doomed"),
    );
    const sandbox = stack.client(SandboxService, stack.addr.sandbox);
    const scope = scopeKey("session", DEV_IDENTITY, "doomed", "");
    assert.ok(
      (await sandbox.listSandboxes({})).sandboxes.some((s) => s.scopeKey === scope),
      "a sandbox to remove",
    );

    const mallory = await stack.gatewayAs("local", "mallory");
    assert.equal(await codeOf(mallory.deleteSession({ sessionId: "doomed" })), Status.NOT_FOUND);
    assert.equal((await stack.gateway.getHistory({ sessionId: "doomed" })).messages.length, 6, "untouched");
    mallory.close();

    const res = await stack.gateway.deleteSession({ sessionId: "doomed" });
    assert.deepEqual([res.memoriesForgotten, res.sandboxRemoved], [0, true]);
    assert.equal(await codeOf(stack.gateway.getHistory({ sessionId: "doomed" })), Status.NOT_FOUND);
    assert.equal(await codeOf(stack.gateway.listSchedules({ sessionId: "doomed" })), Status.NOT_FOUND);
    const listed = (await stack.gateway.listSessions({})).sessions.map((s) => s.sessionId);
    assert.ok(!listed.includes("doomed"), listed.join(", "));
    assert.ok(!(await sandbox.listSandboxes({})).sandboxes.some((s) => s.scopeKey === scope), "the sandbox is gone");
    sandbox.close();
    assert.ok(
      (await memoriesOf("locker code")).some((m) => m.session === "doomed"),
      "memories kept unless asked",
    );
    assert.equal(await codeOf(stack.gateway.deleteSession({ sessionId: "doomed" })), Status.NOT_FOUND, "once");

    // The id may be used again: a new, empty session, its workspace new too.
    const s = new ChatSession(stack.gateway);
    s.open("doomed");
    const opened = await s.waitOpened();
    assert.ok(opened.created);
    const events = await s.turn("$ cat /workspace/f.txt", 30_000);
    s.close();
    const result = events.find((e) => e.payload.case === "toolExecutionEnd");
    assert.match(result?.payload.case === "toolExecutionEnd" ? result.payload.value.result : "", /No such file/);
    assert.equal(Number(events[0].seq) < 10, true, "numbering starts over");
  });

  test("with forget_memories, what was learned in the session goes, and nothing else", async () => {
    await converse("forgetful", "remember that my bike is a green Brompton.");
    await converse("other", "remember that my bike lock is orange.");
    await waitFor("both facts learned", async () => {
      const found = await memoriesOf("bike");
      return found.some((m) => m.session === "forgetful") && found.some((m) => m.session === "other");
    });
    const res = await stack.gateway.deleteSession({ sessionId: "forgetful", forgetMemories: true });
    assert.ok(res.memoriesForgotten >= 1);
    const left = await memoriesOf("bike");
    assert.ok(!left.some((m) => m.session === "forgetful"), JSON.stringify(left));
    assert.ok(left.some((m) => m.session === "other"));
  });

  test("a session goes with its sub-agents: their logs, sandboxes and, when asked, memories", async () => {
    const { parent, children } = await withChildren("family");
    const listed = async () => (await stack.gateway.listSessions({})).sessions.map((x) => x.sessionId);
    for (const c of children) assert.ok((await listed()).includes(c), "a child is listed before");
    await waitFor("the child's memory", async () =>
      (await memoriesOf("heron")).some((m) => children.includes(m.session)),
    );
    const sandbox = stack.client(SandboxService, stack.addr.sandbox);
    const scopes = children.map((c) => scopeKey("session", DEV_IDENTITY, c, ""));
    assert.ok(
      (await sandbox.listSandboxes({})).sandboxes.some((s) => scopes.includes(s.scopeKey)),
      "a child's sandbox",
    );

    const res = await stack.gateway.deleteSession({ sessionId: parent, forgetMemories: true });
    assert.ok(res.memoriesForgotten >= 1, "the child's memory counted");
    for (const id of [parent, ...children]) {
      assert.equal(await codeOf(stack.gateway.getHistory({ sessionId: id })), Status.NOT_FOUND, id);
      assert.ok(!(await listed()).includes(id), id);
      assert.equal(existsSync(sessionLogPath(dataDir, refOf(DEV_IDENTITY, id))), false, `${id}'s log`);
    }
    assert.ok(!(await sandbox.listSandboxes({})).sandboxes.some((s) => scopes.includes(s.scopeKey)), "sandboxes gone");
    sandbox.close();
    assert.ok(
      !(await memoriesOf("heron")).some((m) => children.includes(m.session)),
      "what the child saved is forgotten",
    );
  });

  test("a deletion cut short leaves no sub-agent readable, and is finished by the sweep and at the next start", async () => {
    // What a crash between the parent's removal and its children's leaves: the parent's log gone.
    const live = await withChildren("cut-live");
    await rm(sessionLogPath(dataDir, refOf(DEV_IDENTITY, live.parent)));
    for (const c of live.children)
      assert.equal(await codeOf(stack.gateway.getHistory({ sessionId: c })), Status.NOT_FOUND, "unreadable at once");
    await waitFor("the sweep", async () =>
      live.children.every((c) => !existsSync(sessionLogPath(dataDir, refOf(DEV_IDENTITY, c)))),
    );

    // The runner dies between the parent's removal and its children's (a failpoint), then starts again.
    const killed = await withChildren("cut-killed");
    const runner = stack.process("runner")!;
    const died = new Promise((resolve) => runner.once("exit", (_code, signal) => resolve(signal)));
    assert.notEqual(await codeOf(stack.gateway.deleteSession({ sessionId: killed.parent })), Status.OK);
    assert.equal(await died, "SIGKILL");
    assert.equal(existsSync(sessionLogPath(dataDir, refOf(DEV_IDENTITY, killed.parent))), false, "the parent went");
    assert.ok(
      killed.children.every((c) => existsSync(sessionLogPath(dataDir, refOf(DEV_IDENTITY, c)))),
      "its children did not",
    );
    await stack.kill("runner", "SIGKILL");
    await stack.start("runner");
    for (const c of killed.children)
      assert.equal(await codeOf(stack.gateway.getHistory({ sessionId: c })), Status.NOT_FOUND);
    await waitFor("the start's sweep", async () =>
      killed.children.every((c) => !existsSync(sessionLogPath(dataDir, refOf(DEV_IDENTITY, c)))),
    );
    const sandbox = stack.client(SandboxService, stack.addr.sandbox);
    const scopes = killed.children.map((c) => scopeKey("session", DEV_IDENTITY, c, ""));
    await waitFor(
      "their sandboxes removed",
      async () => !(await sandbox.listSandboxes({})).sandboxes.some((s) => scopes.includes(s.scopeKey)),
    );
    sandbox.close();
  });

  test("a malformed session id is INVALID_ARGUMENT, and the service keeps serving", async () => {
    assert.equal(await codeOf(stack.gateway.deleteSession({ sessionId: "" })), Status.INVALID_ARGUMENT);
    assert.equal(await codeOf(stack.gateway.deleteSession({ sessionId: "x".repeat(500) })), Status.INVALID_ARGUMENT);
    await converse("still-here", "hello");
  });

  test("retention: sessions idle past their agent's retentionDays are deleted; others stay", async () => {
    await converseWith("brief", "brief-old", "hello");
    await converseWith("brief", "brief-new", "hello");
    await converseWith("main", "main-old", "hello");
    // A session the OpenAI endpoint made from one request's messages goes after an idle hour.
    const conversation = `${CONVERSATION_SESSION_PREFIX}retention-test`;
    await converseWith("main", conversation, "hello");
    const hoursAgo = new Date(Date.now() - 2 * 3_600_000);
    await utimes(sessionLogPath(dataDir, refOf(DEV_IDENTITY, conversation)), hoursAgo, hoursAgo);
    // Two days without activity, as the store sees it (the log's modification time).
    const twoDaysAgo = new Date(Date.now() - 2 * 86_400_000);
    for (const id of ["brief-old", "main-old"])
      await utimes(sessionLogPath(dataDir, refOf(DEV_IDENTITY, id)), twoDaysAgo, twoDaysAgo);
    // Listing reads the store without loading (loading would count as activity).
    const listed = async () => (await stack.gateway.listSessions({})).sessions.map((x) => x.sessionId);
    await waitFor(
      "the sweep",
      async () => !(await listed()).includes("brief-old") && !(await listed()).includes(conversation),
      10_000,
    );
    assert.equal(await codeOf(stack.gateway.getHistory({ sessionId: "brief-old" })), Status.NOT_FOUND);
    assert.equal((await stack.gateway.getHistory({ sessionId: "brief-new" })).messages.length, 2, "recent: kept");
    assert.equal((await stack.gateway.getHistory({ sessionId: "main-old" })).messages.length, 2, "no retention: kept");
  });
});
