// Workspaces that outlive their containers (sandbox/workspace-saves.ts), through real processes and
// a real Docker engine: a session's files survive the idle reap, a container's crash, a sandbox
// service SIGKILL and a runner SIGKILL; the next command is told when its sandbox is new and what
// did not survive (and the model reads it in the tool result); DeleteSession removes the save too.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdir } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { exec, savedAfter, sessionContainer, type SandboxClient } from "./helpers/sandbox.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
let stack: Stack;
let sandbox: SandboxClient;
let dataDir: string;

before(async () => {
  stack = await startStack({
    env: { TROUPE_SANDBOX_IDLE_MS: "2500", TROUPE_SANDBOX_POOL: "1", TROUPE_MEMORY_LEARN: "0" },
  });
  dataDir = stack.dataDir;
  sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
});
after(async () => {
  sandbox?.close();
  await stack?.stop();
});

const exists = (name: string) =>
  run("docker", ["inspect", name]).then(
    () => true,
    () => false,
  );
const saves = async () =>
  (await readdir(path.join(dataDir, "workspaces")).catch(() => [])).filter((f) => f.endsWith(".tar"));

/** Removes a container as a crash would (the idle reaper may be removing it already: either way it goes). */
async function lose(name: string): Promise<void> {
  await run("docker", ["rm", "-f", name]).catch(() => undefined);
  await waitFor(`${name} gone`, async () => !(await exists(name)), 10_000, 100);
}

/** The tool result of the one exec call a scripted turn makes. */
async function toolResult(s: ChatSession, command: string): Promise<string> {
  const events = await s.turn(`$ ${command}`, 30_000);
  const end = events.find((e) => e.payload.case === "toolExecutionEnd");
  return end?.payload.case === "toolExecutionEnd" ? end.payload.value.result : "";
}

test("files survive the idle reap; the next command is told its sandbox is new, once", async () => {
  const made = await exec(sandbox, "w-reap", "mkdir -p d && echo kept > d/f && ln -s d/f link && echo ok");
  assert.equal(made.out, "ok\n");
  assert.equal(made.note, "", "a first sandbox has nothing to say");
  const name = sessionContainer(dataDir, "w-reap");
  await waitFor("the idle sandbox reaped", async () => !(await exists(name)), 20_000, 200);
  const back = await exec(sandbox, "w-reap", "cat d/f link; ls -l link | cut -c1");
  assert.equal(back.out, "kept\nkept\nl\n", "files, links and directories as they were");
  assert.match(back.note, /restored from its save of 20\d\d-/);
  assert.equal((await exec(sandbox, "w-reap", "true")).note, "", "told once");
});

test("a container that dies is replaced with the saved files; its running commands are said to be gone", async () => {
  // A command left running (as a background process the agent started would be).
  const held = exec(sandbox, "w-crash", "sleep 120", { timeoutMs: 130_000 }).catch(() => undefined);
  const wrote = Date.now();
  assert.equal((await exec(sandbox, "w-crash", "echo v1 > f && echo ok")).out, "ok\n");
  // The save comes a few seconds after the last command.
  await savedAfter(dataDir, "w-crash", wrote);
  await lose(sessionContainer(dataDir, "w-crash"));
  await held;
  const back = await exec(sandbox, "w-crash", "cat f");
  assert.equal(back.out, "v1\n");
  assert.match(back.note, /restored/);
  assert.match(back.note, /1 command\(s\) running then .* were stopped/);
});

test("through the runner: a sandbox service SIGKILL, a runner SIGKILL and a lost container keep the files, and the model is told", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("w-stack");
  await s.waitOpened();
  assert.match(await toolResult(s, "echo from-a-turn > t.txt && echo written"), /written/);
  await stack.kill("sandbox", "SIGKILL");
  await stack.start("sandbox");
  assert.match(await toolResult(s, "cat t.txt"), /^from-a-turn/, "the container was adopted: nothing to tell");
  s.close();
  await stack.kill("runner", "SIGKILL");
  await stack.start("runner");
  const again = new ChatSession(stack.gateway);
  again.open("w-stack");
  await again.waitOpened();
  const read = Date.now();
  assert.match(await toolResult(again, "cat t.txt"), /from-a-turn/);
  await savedAfter(dataDir, "w-stack", read);
  await lose(sessionContainer(dataDir, "w-stack"));
  const told = await toolResult(again, "cat t.txt");
  assert.match(told, /^\[this sandbox is new: \/workspace was restored from its save of [^\]]+\]\nfrom-a-turn/);
  again.close();
});

test("DeleteSession removes the saved workspace: the id's next session starts empty", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("w-gone");
  await s.waitOpened();
  const before = (await saves()).length;
  const wrote = Date.now();
  await toolResult(s, "echo secret > s.txt");
  await savedAfter(dataDir, "w-gone", wrote);
  assert.equal((await saves()).length, before + 1, "saved");
  s.close();
  await stack.gateway.deleteSession({ sessionId: "w-gone" });
  assert.equal((await saves()).length, before, "the save went with the session");
  const next = new ChatSession(stack.gateway);
  next.open("w-gone");
  await next.waitOpened();
  const read = await toolResult(next, "cat s.txt");
  assert.match(read, /No such file/);
  assert.doesNotMatch(read, /restored/);
  next.close();
});
