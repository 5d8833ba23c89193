// Workspaces that outlive their containers (sandbox/workspaces/workspace-saves.ts), through real processes and
// a real Docker engine: a session's files survive the idle reap, a container's crash, a sandbox
// service SIGKILL and a runner SIGKILL; the next command is told when its sandbox is new and what
// did not survive (and the model reads it in the tool result); DeleteSession removes the save too.
// Snapshots: made from a session's workspace, restored into another session of the tenant, invisible
// to other tenants, counted with saves in the tenant's workspace quota (a save over it is not kept,
// and the next command is told; a snapshot over it is RESOURCE_EXHAUSTED), kept in an S3 bucket
// here (an endpoint written from S3's reference, helpers/s3-server.ts); sandbox-api.test.ts keeps
// them in the data directory.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { Status } from "../services/shared/errors.js";
import { S3Server } from "./helpers/s3-server.js";
import { exec, failsWith, savedAfter, sessionContainer, type SandboxClient } from "./helpers/sandbox.js";
import { ChatSession } from "./helpers/session.js";
import { MAIN, flagsFor, startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
let stack: Stack;
let sandbox: SandboxClient;
let dataDir: string;
let quotaDir: string;
/** A tenant whose workspace quota is 1 MiB (the quotas file below). */
const TIGHT = { tenant: "tight", principal: "p" };
const S3_KEYS = { accessKeyId: "AKIDWORKSPACES", secretAccessKey: "workspaces-test-secret" };
const bucket = new S3Server({ bucket: "troupe-snapshots", ...S3_KEYS, pageKeys: 3 });
/** The bucket's keys of a snapshot. */
const objectsOf = (id: string) => [...bucket.objects.keys()].filter((k) => k.includes(id)).sort();

before(async () => {
  quotaDir = await mkdtemp(path.join(tmpdir(), "troupe-quotas-"));
  await writeFile(
    path.join(quotaDir, "quotas.json"),
    JSON.stringify({ tenants: { tight: { workspaceMegabytes: 1 } } }),
  );
  await bucket.start();
  stack = await startStack({
    env: {
      TROUPE_SANDBOX_SNAPSHOTS: `s3://troupe-snapshots/kept/?endpoint=${bucket.endpoint}`,
      AWS_ACCESS_KEY_ID: S3_KEYS.accessKeyId,
      AWS_SECRET_ACCESS_KEY: S3_KEYS.secretAccessKey,
      TROUPE_SANDBOX_IDLE_MS: "2500",
      TROUPE_SANDBOX_POOL: "1",
      TROUPE_MEMORY_LEARN: "0",
      TROUPE_QUOTAS_FILE: path.join(quotaDir, "quotas.json"),
      TROUPE_SANDBOX_IMAGES: "troupe-sandbox:mcp",
    },
  });
  dataDir = stack.dataDir;
  sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
});
after(async () => {
  sandbox?.close();
  await stack?.stop();
  await bucket.stop();
  await rm(quotaDir, { recursive: true, force: true });
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
  assert.match(back.note, /1 command\(s\) running then .* were stopped and are not running now: "sleep 120"$/);
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

test("a snapshot starts another session of the tenant with its files; other tenants cannot see or use it", async () => {
  await exec(sandbox, "w-snap-src", "mkdir -p app && echo v1 > app/config && echo ok");
  const { snapshot } = await sandbox.createSnapshot({ sessionId: "w-snap-src", name: "base" });
  assert.match(snapshot?.snapshotId ?? "", /^snap-[0-9a-f-]{36}$/);
  assert.ok(Number(snapshot?.sizeBytes) > 0);
  const listed = await sandbox.listSnapshots({});
  assert.deepEqual(
    listed.snapshots.map((x) => [x.snapshotId, x.name, x.sourceSessionId]),
    [[snapshot!.snapshotId, "base", "w-snap-src"]],
  );
  assert.ok(listed.usedBytes >= snapshot!.sizeBytes, "the snapshot counts in the tenant's usage");
  const keys = [`kept/local/${snapshot!.snapshotId}.json`, `kept/local/${snapshot!.snapshotId}.tar`];
  assert.deepEqual(objectsOf(snapshot!.snapshotId), keys, "kept in the bucket");
  assert.equal(BigInt(bucket.objects.get(keys[1])!.body.length), snapshot!.sizeBytes);
  // The source goes on; the snapshot is what it was.
  await exec(sandbox, "w-snap-src", "echo v2 > app/config");

  // Another principal of the same tenant starts a session from it.
  const colleague = stack.client(SandboxService, stack.addr.sandbox, {
    as: { ...DEV_IDENTITY, principal: "colleague" },
  });
  const stranger = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "elsewhere", principal: "dev" } });
  try {
    await colleague.restoreSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: "w-snap-dst" });
    const first = await exec(colleague, "w-snap-dst", "cat app/config");
    assert.equal(first.out, "v1\n");
    assert.match(first.note, new RegExp(`restored from snapshot ${snapshot!.snapshotId} \\("base"\\)`));

    // A session with a workspace is not overwritten unless asked.
    await failsWith(
      colleague.restoreSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: "w-snap-dst" }),
      Status.FAILED_PRECONDITION,
    );
    await exec(colleague, "w-snap-dst", "echo changed > app/config");
    await colleague.restoreSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: "w-snap-dst", replace: true });
    assert.equal((await exec(colleague, "w-snap-dst", "cat app/config")).out, "v1\n");

    // Another tenant: nothing listed, and its id answers as an unknown one does.
    assert.deepEqual((await stranger.listSnapshots({})).snapshots, []);
    const unknown = "snap-00000000-0000-4000-8000-000000000000";
    for (const id of [snapshot!.snapshotId, unknown]) {
      const said = await failsWith(stranger.restoreSnapshot({ snapshotId: id, sessionId: "x1" }), Status.NOT_FOUND);
      assert.equal(said, `no snapshot ${id}`);
      await failsWith(stranger.deleteSnapshot({ snapshotId: id }), Status.NOT_FOUND);
    }
    // Nor can it snapshot this tenant's session: the id names a session of its own, which has no workspace.
    await failsWith(stranger.createSnapshot({ sessionId: "w-snap-src" }), Status.NOT_FOUND);
    await failsWith(sandbox.restoreSnapshot({ snapshotId: "../../etc", sessionId: "x1" }), Status.INVALID_ARGUMENT);
    await failsWith(
      sandbox.createSnapshot({ sessionId: "w-snap-src", name: "n".repeat(101) }),
      Status.INVALID_ARGUMENT,
    );

    // The operator's command line: snapshot a session, list, delete.
    // Run apart from this process's event loop, which serves the bucket the sandbox service writes to.
    const troupe = (...args: string[]) =>
      run(process.execPath, [MAIN, "sandbox", ...args, ...flagsFor(stack.addr, dataDir)], { timeout: 60_000 }).then(
        (r) => ({ status: 0, ...r }),
        (err: { code?: number; stdout?: string; stderr?: string }) => ({
          status: err.code ?? null,
          stdout: err.stdout ?? "",
          stderr: err.stderr ?? "",
        }),
      );
    const made = await troupe("snapshot", "w-snap-src", "--name", "by-cli");
    assert.equal(made.status, 0, made.stderr);
    const id = made.stdout.trim();
    const table = await troupe("snapshots");
    assert.equal(table.status, 0, table.stderr);
    assert.match(table.stdout, new RegExp(`^${id} +by-cli +w-snap-src `, "m"));
    assert.match(table.stdout, /tenant local keeps [\d.]+ of 4096 MiB/);
    assert.equal((await troupe("snapshot-rm", id)).status, 0);
    const gone = await troupe("restore", id, "--session", "w-snap-x");
    assert.equal(gone.status, 1);
    assert.match(gone.stderr, /NOT_FOUND/);

    await sandbox.deleteSnapshot({ snapshotId: snapshot!.snapshotId });
    assert.deepEqual((await sandbox.listSnapshots({})).snapshots, []);
    assert.deepEqual(objectsOf(snapshot!.snapshotId), [], "its objects are deleted");
  } finally {
    colleague.close();
    stranger.close();
  }
});

test("snapshots in a bucket: read back after a restart with no cache; a bucket down fails the call, not the commands", async () => {
  await exec(sandbox, "w-bucket", "echo from the bucket > kept.txt && echo ok");
  const { snapshot } = await sandbox.createSnapshot({ sessionId: "w-bucket" });
  const id = snapshot!.snapshotId;
  await stack.kill("sandbox", "SIGKILL");
  await rm(path.join(dataDir, "snapshot-cache"), { recursive: true, force: true });
  await stack.start("sandbox");
  const listed = await sandbox.listSnapshots({});
  assert.deepEqual(
    listed.snapshots.map((x) => x.snapshotId),
    [id],
  );
  assert.ok(listed.usedBytes >= snapshot!.sizeBytes, "counted again from the bucket on start");
  const gets = bucket.log.filter((l) => l.startsWith(`GET kept/local/${id}.tar`)).length;
  await sandbox.restoreSnapshot({ snapshotId: id, sessionId: "w-bucket-copy" });
  assert.equal((await exec(sandbox, "w-bucket-copy", "cat kept.txt")).out, "from the bucket\n");
  assert.equal(
    bucket.log.filter((l) => l.startsWith(`GET kept/local/${id}.tar 200`)).length,
    gets + 1,
    "the archive came from the bucket",
  );

  await bucket.stop();
  try {
    const said = await failsWith(sandbox.createSnapshot({ sessionId: "w-bucket" }), Status.UNAVAILABLE);
    assert.match(said, /^snapshot store s3:\/\/troupe-snapshots\/kept\/: writing an archive failed/);
    await failsWith(sandbox.listSnapshots({}), Status.UNAVAILABLE);
    assert.equal((await exec(sandbox, "w-bucket", "cat kept.txt")).out, "from the bucket\n", "commands go on");
  } finally {
    await bucket.start();
  }
  assert.deepEqual(
    (await sandbox.listSnapshots({})).snapshots.map((x) => x.snapshotId),
    [id],
    "the failed snapshot left nothing",
  );
  await sandbox.deleteSnapshot({ snapshotId: id });
  assert.deepEqual(objectsOf(id), []);
});

test("the workspace quota: a save over it is not kept and the next sandbox says so; a snapshot is RESOURCE_EXHAUSTED", async () => {
  const tight = stack.client(SandboxService, stack.addr.sandbox, { as: TIGHT });
  try {
    const small = Date.now();
    await exec(tight, "w-quota", "head -c 200000 /dev/urandom > small && echo ok");
    assert.equal((await savedAfter(dataDir, "w-quota", small, TIGHT)).refused, undefined, "200 KB fit in 1 MiB");
    const big = Date.now();
    await exec(tight, "w-quota", "head -c 2000000 /dev/urandom > big && echo ok");
    const record = await savedAfter(dataDir, "w-quota", big, TIGHT);
    assert.match(record.refused ?? "", /left of tenant tight's workspace quota \(1 MiB/);
    // The idle reaper (2.5 s here) takes the sandbox after that refused save: what was lost is said.
    const name = sessionContainer(dataDir, "w-quota", TIGHT);
    await waitFor("the idle sandbox reaped", async () => !(await exists(name)), 20_000, 200);
    const told = await exec(tight, "w-quota", "ls");
    assert.equal(told.out, "", "nothing was kept");
    assert.match(
      told.note,
      /^this sandbox is new and \/workspace starts empty: its files of 20\d\d-\S+ were not kept \(it is larger than the 1\.0 MiB left of tenant tight's workspace quota \(1 MiB for saved workspaces and snapshots\)\)$/,
    );
    await exec(tight, "w-quota", "head -c 2000000 /dev/urandom > big");
    const said = await failsWith(tight.createSnapshot({ sessionId: "w-quota" }), Status.RESOURCE_EXHAUSTED);
    assert.match(said, /^this snapshot does not fit: it is larger than the [\d.]+ MiB left of tenant tight's/);
    // Room made: the next save is kept again.
    const freed = Date.now();
    await exec(tight, "w-quota", "rm big");
    assert.equal((await savedAfter(dataDir, "w-quota", freed, TIGHT)).refused, undefined);
    assert.equal((await tight.listSnapshots({})).quotaBytes, BigInt(1024 * 1024));
  } finally {
    tight.close();
  }
});

test("an agent's template (agent.json workspace): its image and files are there at the first command, and the model is told", async () => {
  await writeAgent(dataDir, "starter", { workspace: { image: "troupe-sandbox:mcp", files: "starter-files" } });
  await mkdir(path.join(dataDir, "agents", "starter", "starter-files", "src"), { recursive: true });
  await writeFile(
    path.join(dataDir, "agents", "starter", "starter-files", "src", "hello.py"),
    "print('hi from starter')\n",
  );
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { sessionId: "w-template", agentId: "starter", create: true } });
  await s.waitOpened();
  const result = await toolResult(s, "python3 src/hello.py");
  assert.equal(
    result.split("\n")[0],
    "[this sandbox is new: /workspace starts with the files of agent starter's template]",
  );
  assert.match(result, /\nhi from starter/);
  // The template is the start of a workspace, not a reset: later commands see the session's own files.
  await toolResult(s, "echo mine > src/mine.txt");
  assert.match(await toolResult(s, "ls src"), /^hello\.py\nmine\.txt/);
  s.close();
});

test("through the gateway: a user snapshots a session and starts another from it; other tenants see nothing", async () => {
  const s = new ChatSession(stack.gateway);
  s.open("w-user-src");
  await s.waitOpened();
  await toolResult(s, "mkdir -p notes && echo draft-1 > notes/plan.md");
  s.close();
  const { snapshot } = await stack.gateway.snapshotWorkspace({ sessionId: "w-user-src", name: "plan" });
  assert.equal(snapshot?.sourceSessionId, "w-user-src");
  const mine = await stack.gateway.listWorkspaceSnapshots({});
  assert.ok(mine.snapshots.some((x) => x.snapshotId === snapshot!.snapshotId && x.name === "plan"));
  await stack.gateway.restoreWorkspaceSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: "w-user-dst" });
  const next = new ChatSession(stack.gateway);
  next.open("w-user-dst");
  await next.waitOpened();
  const read = await toolResult(next, "cat notes/plan.md");
  assert.match(
    read,
    new RegExp(
      `^\\[this sandbox is new: /workspace was restored from snapshot ${snapshot!.snapshotId} \\("plan"\\) of [^\\]]+\\]\\ndraft-1`,
    ),
  );
  next.close();

  const other = await stack.gatewayAs("another-tenant", "eve");
  try {
    assert.deepEqual((await other.listWorkspaceSnapshots({})).snapshots, []);
    const said = await failsWith(
      other.restoreWorkspaceSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: "x" }),
      Status.NOT_FOUND,
    );
    assert.equal(said, `no snapshot ${snapshot!.snapshotId}`);
    await failsWith(other.deleteWorkspaceSnapshot({ snapshotId: snapshot!.snapshotId }), Status.NOT_FOUND);
    // The same session id names eve's own session, which has no workspace.
    await failsWith(other.snapshotWorkspace({ sessionId: "w-user-src" }), Status.NOT_FOUND);
  } finally {
    other.close();
  }
  await stack.gateway.deleteWorkspaceSnapshot({ snapshotId: snapshot!.snapshotId });
  await failsWith(
    stack.gateway.restoreWorkspaceSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: "w-user-3" }),
    Status.NOT_FOUND,
  );
});

test("an agent's template may be a snapshot: its tenant's sessions start from it, another tenant's start empty and are told", async () => {
  await exec(sandbox, "w-tsnap-src", "echo base > base.txt");
  const { snapshot } = await sandbox.createSnapshot({ sessionId: "w-tsnap-src", name: "base" });
  const id = snapshot!.snapshotId;
  await writeAgent(dataDir, "from-snap", { workspace: { snapshot: id } });
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { sessionId: "w-tsnap-1", agentId: "from-snap", create: true } });
  await s.waitOpened();
  assert.equal(
    await toolResult(s, "cat base.txt"),
    `[this sandbox is new: /workspace starts with snapshot ${id} (agent from-snap's template)]\nbase\n[exit 0]`,
  );
  s.close();
  const other = await stack.gatewayAs("another-tenant", "eve");
  const theirs = new ChatSession(other);
  try {
    theirs.send({ case: "open", value: { sessionId: "w-tsnap-2", agentId: "from-snap", create: true } });
    await theirs.waitOpened();
    const told = await toolResult(theirs, "ls | wc -l");
    assert.match(
      told,
      new RegExp(
        `^\\[this sandbox is new and /workspace starts empty: agent from-snap's template names snapshot ${id}, which this session's tenant does not hold\\]\\n\\s*0\\n`,
      ),
    );
  } finally {
    theirs.close();
    other.close();
  }
  // The bucket down and the archive not cached: the model is told that, not that its tenant lacks it.
  await rm(path.join(dataDir, "snapshot-cache"), { recursive: true, force: true });
  await bucket.stop();
  const down = new ChatSession(stack.gateway);
  try {
    down.send({ case: "open", value: { sessionId: "w-tsnap-3", agentId: "from-snap", create: true } });
    await down.waitOpened();
    assert.match(
      await toolResult(down, "ls | wc -l"),
      new RegExp(
        `^\\[this sandbox is new and /workspace starts empty: snapshot ${id} \\(agent from-snap's template\\) could not be read or unpacked \\(snapshot store s3://troupe-snapshots/kept/: reading a record failed`,
      ),
    );
  } finally {
    down.close();
    await bucket.start();
  }
  await sandbox.deleteSnapshot({ snapshotId: id });
});
