// The sandbox service's API beyond a plain command: workspace files (and the attacks on them,
// 19-24 of anchors-sandbox.md section (b)), signals, stdin, backpressure, the warm pool, scopes,
// a service restart, the operator CLI, and the runner's file tools end to end. Real Docker.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import {
  Health,
  HealthCheckResponse_ServingStatus as Serving,
} from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { FileType, SandboxService, Signal, type ExecExit } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { scopeKey } from "../services/sandbox/scope.js";
import { Status } from "../services/shared/errors.js";
import { createClient } from "../services/shared/rpc.js";
import { containerName, instanceOf } from "../services/sandbox/container-spec.js";
import { exec, failsWith, savedAfter, type SandboxClient, sessionContainer } from "./helpers/sandbox.js";
import { MAIN, startStack, waitFor, type Stack, sandboxContainers } from "./helpers/stack.js";
import { tempDir } from "./helpers/tempdir.js";

const run = promisify(execFile);
/** An image with python3 and node (make sandbox-image-mcp), allowed here for templates. */
const MCP_IMAGE = "troupe-sandbox:mcp";
type Sandbox = SandboxClient;

for (const runtime of ["runc", "runsc"] as const) {
  describe(`sandbox workspace files (${runtime})`, () => {
    let stack: Stack;
    let sandbox: Sandbox;
    let quotas: string;
    const id = `files-${runtime}`;
    before(async () => {
      // Tenant "tight" has a workspace quota of 1 MiB.
      quotas = path.join(await mkdtemp(path.join(tmpdir(), "troupe-quotas-")), "quotas.json");
      await writeFile(quotas, JSON.stringify({ tenants: { tight: { workspaceMegabytes: 1 } } }));
      stack = await startStack({
        services: ["sandbox"],
        env: { TROUPE_SANDBOX_RUNTIME: runtime, TROUPE_QUOTAS_FILE: quotas, TROUPE_SANDBOX_IMAGES: MCP_IMAGE },
      });
      sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
    });
    after(async () => {
      await sandbox?.releaseSandbox({ sessionId: id }).catch(() => undefined);
      sandbox?.close();
      await stack?.stop();
      await rm(path.dirname(quotas), { recursive: true, force: true });
    });

    test("write, read and list round trip; commands see the same files", async () => {
      const bytes = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7) % 256));
      assert.equal(
        (await sandbox.writeFile({ sessionId: id, path: "data/bin/blob", data: bytes, createParents: true }))
          .bytesWritten,
        70_000n,
      );
      const back = await sandbox.readFile({ sessionId: id, path: "/workspace/data/bin/blob" });
      assert.ok(Buffer.from(back.data).equals(bytes), "binary content byte for byte");
      assert.equal(back.size, 70_000n);
      assert.equal(back.truncated, false);
      const part = await sandbox.readFile({ sessionId: id, path: "data/bin/blob", maxBytes: 100 });
      assert.equal(part.data.length, 100);
      assert.equal(part.truncated, true);

      await sandbox.writeFile({
        sessionId: id,
        path: "run.sh",
        data: Buffer.from("#!/bin/sh\necho ran $1\n"),
        mode: 0o755,
      });
      const r = await exec(sandbox, id, "./run.sh ok; cat data/bin/blob | wc -c; echo made > data/by-command");
      assert.equal(r.out, "ran ok\n70000\n");
      assert.equal(
        Buffer.from((await sandbox.readFile({ sessionId: id, path: "data/by-command" })).data).toString(),
        "made\n",
      );

      const listing = await sandbox.listFiles({ sessionId: id, path: "data" });
      assert.deepEqual(
        listing.entries.map((e) => [e.name, e.type]),
        [
          ["bin", FileType.DIRECTORY],
          ["by-command", FileType.FILE],
        ],
      );
      const root = await sandbox.listFiles({ sessionId: id, path: "" });
      assert.ok(root.entries.some((e) => e.name === "run.sh" && e.type === FileType.FILE && e.size === 22n));
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "no/such/dir/f", data: Buffer.from("x") }),
        Status.NOT_FOUND,
      );
    });

    test("the workspace outlives its container: a new one gets the files, and its first command is told", async () => {
      const since = Date.now();
      await sandbox.writeFile({
        sessionId: id,
        path: "kept/note.txt",
        data: Buffer.from("still here"),
        createParents: true,
      });
      assert.equal((await exec(sandbox, id, "echo more > kept/more.txt && echo ok")).out, "ok\n");
      await savedAfter(stack.dataDir, id, since);
      await run("docker", ["rm", "-f", sessionContainer(stack.dataDir, id)]);
      const back = await exec(sandbox, id, "cat kept/note.txt kept/more.txt");
      assert.equal(back.out, "still heremore\n");
      assert.match(back.note, /restored from its save/);
    });

    test("a snapshot of the workspace starts another session with its files", async () => {
      const { snapshot } = await sandbox.createSnapshot({ sessionId: id, name: runtime });
      await sandbox.restoreSnapshot({ snapshotId: snapshot!.snapshotId, sessionId: `${id}-copy` });
      const copy = await exec(sandbox, `${id}-copy`, "cat kept/note.txt kept/more.txt");
      assert.equal(copy.out, "still heremore\n");
      assert.match(copy.note, new RegExp(`restored from snapshot ${snapshot!.snapshotId} \\("${runtime}"\\)`));
      await sandbox.releaseSandbox({ sessionId: `${id}-copy` });
      await sandbox.deleteSnapshot({ snapshotId: snapshot!.snapshotId });
    });

    test("an agent's template: its image and files start each new workspace; its pool is kept warm", async () => {
      const dir = await mkdtemp(path.join(tmpdir(), "troupe-template-"));
      try {
        await writeFile(path.join(dir, "hello.py"), "print('hello from the template')\n");
        const files = (await run("tar", ["--format=ustar", "-C", dir, "-cf", "-", "."], { encoding: "buffer" })).stdout;
        const filesSha256 = createHash("sha256").update(files).digest("hex");
        const agentId = `tpl-${runtime}`;
        // Refused: an image the service does not allow, and files that are not what their hash says.
        await failsWith(
          sandbox.putTemplate({ agentId, image: "alpine:latest", files, filesSha256 }),
          Status.FAILED_PRECONDITION,
        );
        await failsWith(
          sandbox.putTemplate({ agentId, image: MCP_IMAGE, files, filesSha256: "0".repeat(64) }),
          Status.INVALID_ARGUMENT,
        );
        assert.equal((await sandbox.putTemplate({ agentId, image: MCP_IMAGE, files, filesSha256 })).changed, true);
        assert.equal((await sandbox.putTemplate({ agentId, image: MCP_IMAGE, files, filesSha256 })).changed, false);
        // The image's pool fills once a template names it.
        await waitFor(
          "a warm sandbox of the template's image",
          async () => (await sandbox.listSandboxes({})).sandboxes.some((x) => x.pooled && x.image === MCP_IMAGE),
          120_000,
          250,
        );
        const first = await exec(sandbox, `${id}-tpl`, "python3 hello.py && ls", { agentId });
        assert.equal(first.out, "hello from the template\nhello.py\n", "python3 is the template image's");
        assert.equal(
          first.note,
          `this sandbox is new: /workspace starts with the files of agent ${agentId}'s template`,
        );
        const mine = (await sandbox.listSandboxes({})).sandboxes.find(
          (x) =>
            x.name ===
            containerName(instanceOf(stack.dataDir), scopeKey("session", DEV_IDENTITY, `${id}-tpl`, agentId)),
        );
        assert.equal(mine?.image, MCP_IMAGE);
        // Another agent's sessions are untouched: the service's own image, an empty workspace.
        const plain = await exec(sandbox, `${id}-plain`, "ls; command -v python3 || echo none");
        assert.equal(plain.out, "none\n");
        // An empty template removes it, and the warm sandboxes kept for its image go with it.
        assert.equal((await sandbox.putTemplate({ agentId })).changed, true);
        assert.equal((await exec(sandbox, `${id}-after`, "ls", { agentId })).out, "");
        await waitFor(
          "the template image's pool to go",
          async () => !(await sandbox.listSandboxes({})).sandboxes.some((x) => x.pooled && x.image === MCP_IMAGE),
          30_000,
          250,
        );
        for (const session of [`${id}-tpl`, `${id}-plain`, `${id}-after`])
          await sandbox.releaseSandbox({ sessionId: session, agentId });
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });

    test("a save over the tenant's workspace quota is not kept, and the sandbox's next command is told", async () => {
      const tight = stack.client(SandboxService, stack.addr.sandbox, { as: { tenant: "tight", principal: "p" } });
      const owner = { tenant: "tight", principal: "p" };
      try {
        const since = Date.now();
        await exec(tight, "q", "head -c 2000000 /dev/urandom > big");
        assert.match((await savedAfter(stack.dataDir, "q", since, owner)).refused ?? "", /workspace quota \(1 MiB/);
        const told = await exec(tight, "q", "ls");
        assert.equal(told.out, "big\n", "the live workspace is untouched");
        assert.match(told.note, /^\/workspace was not saved: it is larger than the 1\.0 MiB left of tenant tight's/);
        assert.match(told.note, /These files are lost when this sandbox is reaped unless room is made/);
        await tight.releaseSandbox({ sessionId: "q" });
      } finally {
        tight.close();
      }
    });

    test("#19 path traversal, absolute paths, NUL bytes and overlong paths are refused", async () => {
      await failsWith(sandbox.readFile({ sessionId: id, path: "../../etc/passwd" }), Status.INVALID_ARGUMENT);
      await failsWith(sandbox.readFile({ sessionId: id, path: "data/../../etc/passwd" }), Status.INVALID_ARGUMENT);
      await failsWith(sandbox.readFile({ sessionId: id, path: "/etc/shadow" }), Status.PERMISSION_DENIED);
      await failsWith(sandbox.readFile({ sessionId: id, path: "/workspace/../etc/passwd" }), Status.INVALID_ARGUMENT);
      await failsWith(sandbox.readFile({ sessionId: id, path: "a\0b" }), Status.INVALID_ARGUMENT);
      await failsWith(sandbox.readFile({ sessionId: id, path: "x/".repeat(2100) }), Status.INVALID_ARGUMENT);
      await failsWith(sandbox.readFile({ sessionId: id, path: "y".repeat(300) }), Status.INVALID_ARGUMENT);
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "../escape", data: Buffer.from("x") }),
        Status.INVALID_ARGUMENT,
      );
      await failsWith(sandbox.listFiles({ sessionId: id, path: "/" }), Status.PERMISSION_DENIED);
      // No decoding: "%2e%2e" is a name like any other, and there is no such file.
      await failsWith(sandbox.readFile({ sessionId: id, path: "%2e%2e/etc/passwd" }), Status.NOT_FOUND);
      await failsWith(sandbox.readFile({ sessionId: id, path: "" }), Status.INVALID_ARGUMENT);
    });

    test("#20 #21 links lead nowhere outside the workspace; links inside it work", async () => {
      await exec(
        sandbox,
        id,
        "mkdir -p sub/inner && echo inside > sub/inner/f && ln -sf / rootlink && ln -sf .. sub/up && ln -sf ../../.. sub/inner/up3 && ln -sf /workspace/sub/inner abs && ln -sf inner/f sub/rel",
      );
      assert.match(
        await failsWith(sandbox.readFile({ sessionId: id, path: "rootlink/etc/hostname" }), Status.PERMISSION_DENIED),
        /leads out of the workspace/,
      );
      await failsWith(sandbox.listFiles({ sessionId: id, path: "rootlink" }), Status.PERMISSION_DENIED);
      await failsWith(sandbox.readFile({ sessionId: id, path: "sub/inner/up3/etc/passwd" }), Status.PERMISSION_DENIED);
      await failsWith(sandbox.readFile({ sessionId: id, path: "sub/up/../outside" }), Status.INVALID_ARGUMENT);
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "rootlink/tmp/planted", data: Buffer.from("x") }),
        Status.PERMISSION_DENIED,
      );
      // Links that stay inside are followed.
      assert.equal(Buffer.from((await sandbox.readFile({ sessionId: id, path: "abs/f" })).data).toString(), "inside\n");
      assert.equal(
        Buffer.from((await sandbox.readFile({ sessionId: id, path: "sub/rel" })).data).toString(),
        "inside\n",
      );
      assert.equal(
        Buffer.from((await sandbox.readFile({ sessionId: id, path: "sub/up/sub/inner/f" })).data).toString(),
        "inside\n",
      );
      const r = await exec(sandbox, id, "ls /tmp/planted 2>&1");
      assert.match(r.out, /No such file/);
    });

    test("#22 a write through a link that points outside is refused; nothing lands outside", async () => {
      await exec(sandbox, id, "ln -sf /tmp/target dangling && ln -sf /etc/passwd pw");
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "dangling", data: Buffer.from("x") }),
        Status.PERMISSION_DENIED,
      );
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "pw", data: Buffer.from("x") }),
        Status.PERMISSION_DENIED,
      );
      const r = await exec(sandbox, id, "ls /tmp/target 2>&1; grep -c '^x$' /etc/passwd");
      assert.match(r.out, /No such file/);
      assert.match(r.out, /^0$/m);
    });

    test("#23 a directory swapped for a link while files are written: nothing lands outside", async () => {
      // A loop in the sandbox turns `race` back and forth between a directory and a link to /tmp
      // while the service writes race/f over and over.
      const loop = exec(
        sandbox,
        id,
        "end=$(($(date +%s) + 4)); while [ $(date +%s) -lt $end ]; do rm -rf race; mkdir race; rm -rf race; ln -s /tmp race; done; rm -rf race",
        { timeoutMs: 10_000 },
      );
      const outcomes = new Map<string, number>();
      const t0 = Date.now();
      while (Date.now() - t0 < 3000) {
        const code = await sandbox.writeFile({ sessionId: id, path: "race/f", data: Buffer.from("x") }).then(
          () => "OK",
          (e: { code: number }) => Status[e.code],
        );
        outcomes.set(code, (outcomes.get(code) ?? 0) + 1);
      }
      await loop;
      for (const code of outcomes.keys())
        assert.ok(["OK", "PERMISSION_DENIED", "NOT_FOUND", "FAILED_PRECONDITION"].includes(code), `unexpected ${code}`);
      const r = await exec(sandbox, id, "ls /tmp/f 2>&1");
      assert.match(r.out, /No such file/, `a write escaped to /tmp (outcomes: ${JSON.stringify([...outcomes])})`);
    });

    test("#24 hard links to files outside the workspace cannot be made", async () => {
      const r = await exec(sandbox, id, "ln /etc/passwd hard 2>&1; echo rc=$?");
      assert.match(r.out, /rc=1/);
      await failsWith(sandbox.readFile({ sessionId: id, path: "hard" }), Status.NOT_FOUND);
    });

    test("FIFOs, directories and device-like files are not read; a full workspace is RESOURCE_EXHAUSTED", async () => {
      await exec(sandbox, id, "mkfifo pipe");
      // Would block forever if opened for a blocking read.
      await failsWith(sandbox.readFile({ sessionId: id, path: "pipe" }), Status.FAILED_PRECONDITION);
      await failsWith(sandbox.readFile({ sessionId: id, path: "sub" }), Status.FAILED_PRECONDITION);
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "sub", data: Buffer.from("x") }),
        Status.FAILED_PRECONDITION,
      );
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "s", data: Buffer.from("x"), mode: 0o4755 }),
        Status.INVALID_ARGUMENT,
      );
      await exec(sandbox, id, "dd if=/dev/zero of=fill bs=1M count=300 2>/dev/null; true");
      await failsWith(
        sandbox.writeFile({ sessionId: id, path: "more", data: Buffer.alloc(2 * 1024 * 1024) }),
        Status.RESOURCE_EXHAUSTED,
      );
      await exec(sandbox, id, "rm -f fill");
      assert.equal(
        (await sandbox.writeFile({ sessionId: id, path: "more", data: Buffer.alloc(1024) })).bytesWritten,
        1024n,
      );
      const health = createClient(Health, stack.addr.sandbox);
      assert.equal((await health.check({ service: "" })).status, Serving.SERVING);
      health.close();
    });
  });
}

describe("sandbox processes, pool, scopes and restarts (runc)", () => {
  let stack: Stack;
  let sandbox: Sandbox;
  before(async () => {
    stack = await startStack({ services: ["sandbox"], env: { TROUPE_SANDBOX_POOL: "2" } });
    sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
  });
  after(async () => {
    sandbox?.close();
    await stack?.stop();
  });

  test("a signal reaches the running command by the id its first message gave", async () => {
    const id = "proc-signal";
    const call = sandbox.exec({
      sessionId: id,
      command: "trap 'echo got INT; exit 3' INT; echo ready; while :; do sleep 0.1; done",
      timeoutMs: 20_000,
    });
    let execId = "";
    let out = "";
    let exit: ExecExit | undefined;
    for await (const m of call) {
      if (m.kind.case === "started") execId = m.kind.value.execId;
      if (m.kind.case === "stdout") {
        out += Buffer.from(m.kind.value).toString();
        if (out === "ready\n") {
          // Another session cannot signal it, and an unknown id is not found.
          await failsWith(
            sandbox.signalExec({ sessionId: "proc-other", execId, signal: Signal.KILL }),
            Status.NOT_FOUND,
          );
          await failsWith(sandbox.signalExec({ sessionId: id, execId: "nope", signal: Signal.KILL }), Status.NOT_FOUND);
          await failsWith(
            sandbox.signalExec({ sessionId: id, execId, signal: Signal.UNSPECIFIED }),
            Status.INVALID_ARGUMENT,
          );
          await sandbox.signalExec({ sessionId: id, execId, signal: Signal.INTERRUPT });
        }
      }
      if (m.kind.case === "exit") exit = m.kind.value;
    }
    assert.ok(execId);
    assert.equal(out, "ready\ngot INT\n");
    assert.equal(exit?.exitCode, 3);
    await failsWith(sandbox.signalExec({ sessionId: id, execId, signal: Signal.KILL }), Status.NOT_FOUND);
    await sandbox.releaseSandbox({ sessionId: id });
  });

  test("stdin reaches the command whole, and is closed after", async () => {
    const data = Buffer.alloc(3_000_000, "a");
    const r = await exec(sandbox, "proc-stdin", "wc -c; cat; echo end", { stdin: data });
    assert.equal(r.out, "3000000\nend\n");
    await sandbox.releaseSandbox({ sessionId: "proc-stdin" });
  });

  test("stdin kept open: WriteStdin feeds a running command until it closes it; foreign and closed ones are refused", async () => {
    const id = "proc-open-stdin";
    const call = sandbox.exec({
      sessionId: id,
      // After end of file it waits to be killed, so the closed stdin is checked while it runs.
      command: 'echo ready; while read line; do echo "got:$line"; done; echo eof; while :; do sleep 0.1; done',
      timeoutMs: 20_000,
      stdin: Buffer.from("first\n"),
      openStdin: true,
    });
    let execId = "";
    let out = "";
    let exit: ExecExit | undefined;
    let step = 0;
    for await (const m of call) {
      if (m.kind.case === "started") execId = m.kind.value.execId;
      if (m.kind.case === "stdout") out += Buffer.from(m.kind.value).toString();
      if (m.kind.case === "exit") exit = m.kind.value;
      if (step === 0 && out.includes("got:first\n")) {
        step = 1;
        await failsWith(
          sandbox.writeStdin({ sessionId: "proc-other", execId, data: Buffer.from("x\n") }),
          Status.NOT_FOUND,
        );
        await failsWith(
          sandbox.writeStdin({ sessionId: id, execId: "nope", data: Buffer.from("x\n") }),
          Status.NOT_FOUND,
        );
        await failsWith(
          sandbox.writeStdin({ sessionId: id, execId, data: Buffer.alloc(1024 * 1024 + 1) }),
          Status.INVALID_ARGUMENT,
        );
        await sandbox.writeStdin({ sessionId: id, execId, data: Buffer.from("second\n") });
      }
      if (step === 1 && out.includes("got:second\n")) {
        step = 2;
        await sandbox.writeStdin({ sessionId: id, execId, data: Buffer.from("third\n"), close: true });
        await failsWith(
          sandbox.writeStdin({ sessionId: id, execId, data: Buffer.from("x\n") }),
          Status.FAILED_PRECONDITION,
        );
      }
      if (step === 2 && out.endsWith("eof\n")) {
        step = 3;
        await sandbox.signalExec({ sessionId: id, execId, signal: Signal.KILL });
      }
    }
    assert.equal(out, "ready\ngot:first\ngot:second\ngot:third\neof\n");
    assert.equal(exit?.exitCode, 137);
    await failsWith(sandbox.writeStdin({ sessionId: id, execId, data: Buffer.from("x") }), Status.NOT_FOUND);
    await sandbox.releaseSandbox({ sessionId: id });
  });

  test("backpressure: a caller that stops reading stops the command's output at its source", async () => {
    const id = "proc-backpressure";
    // Counts 64 KiB blocks written; each write blocks once nobody reads.
    const call = sandbox.exec({
      sessionId: id,
      command: "i=0; while :; do head -c 65536 /dev/zero; i=$((i+1)); echo $i > /workspace/progress; done",
      timeoutMs: 30_000,
      maxOutputBytes: 16 * 1024 * 1024,
    });
    const it = call[Symbol.asyncIterator]();
    await it.next(); // started
    await it.next(); // the first output
    await new Promise((r) => setTimeout(r, 1500));
    const progress = Number(Buffer.from((await sandbox.readFile({ sessionId: id, path: "progress" })).data).toString());
    // Unthrottled, /dev/zero makes thousands of blocks a second; held back, the agent's window,
    // the pipe and the transport's buffers hold a few MiB at most.
    assert.ok(progress < 100, `${progress} blocks written while nobody read`);
    call.cancel();
    await sandbox.killProcesses({ sessionId: id });
    await sandbox.releaseSandbox({ sessionId: id });
  });

  test("the warm pool: claimed per session, refilled, never reused across sessions", async () => {
    const name = (key: string) => containerName(instanceOf(stack.dataDir), key);
    const pooled = async () =>
      (await sandbox.listSandboxes({})).sandboxes
        .filter((s) => s.pooled && s.scopeKey === "" && s.state === "running")
        .map((s) => s.containerId);
    await waitFor("a full pool", async () => (await pooled()).length === 2, 30_000, 100);
    const before = await pooled();
    await exec(sandbox, "pool-a", "echo a > mine");
    const a = (
      await run("docker", ["inspect", "-f", "{{.Id}}", name(scopeKey("session", DEV_IDENTITY, "pool-a", ""))])
    ).stdout.trim();
    assert.ok(before.includes(a), "session a got a pooled container");
    await waitFor("the pool to refill", async () => (await pooled()).length === 2, 30_000, 100);
    const listed = (await sandbox.listSandboxes({})).sandboxes.find((s) => s.containerId === a);
    assert.equal(listed?.scopeKey, scopeKey("session", DEV_IDENTITY, "pool-a", ""));
    await sandbox.releaseSandbox({ sessionId: "pool-a" });
    await exec(sandbox, "pool-b", "true");
    const b = (
      await run("docker", ["inspect", "-f", "{{.Id}}", name(scopeKey("session", DEV_IDENTITY, "pool-b", ""))])
    ).stdout.trim();
    assert.notEqual(a, b);
    const all = (await sandbox.listSandboxes({})).sandboxes.map((s) => s.containerId);
    assert.ok(!all.includes(a), "a released container is gone, not back in the pool");
    assert.match((await exec(sandbox, "pool-b", "cat mine 2>&1")).out, /No such file/);
    await sandbox.releaseSandbox({ sessionId: "pool-b" });
  });

  test("a restarted service takes its sessions' sandboxes back, files included", async () => {
    await sandbox.writeFile({ sessionId: "restart-1", path: "kept", data: Buffer.from("still here") });
    await stack.kill("sandbox");
    await stack.start("sandbox");
    const r = await exec(sandbox, "restart-1", "cat kept");
    assert.equal(r.out, "still here");
    await sandbox.releaseSandbox({ sessionId: "restart-1" });
  });

  test("the operator CLI lists, runs in and removes sandboxes", async () => {
    const cli = (sub: string, ...args: string[]) =>
      run(process.execPath, [
        MAIN,
        "sandbox",
        sub,
        "--sandbox",
        stack.addr.sandbox,
        "--data-dir",
        stack.dataDir,
        ...args,
      ]);
    const ran = await cli("exec", "--session", "cli-1", "--", "echo", "from", "cli");
    assert.equal(ran.stdout, "from cli\n");
    // argv is kept, as docker exec keeps it: a script given to sh -c runs whole, words stay words.
    assert.equal((await cli("exec", "--session", "cli-1", "--", "sh", "-c", "echo a; echo b")).stdout, "a\nb\n");
    assert.equal(
      (await cli("exec", "--session", "cli-1", "--", "printf", "[%s]\\n", "two words", "it's", "$HOME", "*")).stdout,
      "[two words]\n[it's]\n[$HOME]\n[*]\n",
    );
    await assert.rejects(
      cli("exec", "--session", "cli-1", "--", "sh", "-c", "exit 4"),
      (e: { code: number }) => e.code === 4,
    );
    const ls = (await cli("ls")).stdout;
    assert.match(ls, /^NAME\s+SCOPE\s+STATE/);
    const key = scopeKey("session", DEV_IDENTITY, "cli-1", "");
    assert.match(ls, new RegExp(`${key}\\s+running`));
    assert.match(ls, /\(pool\)/);
    // Another owner's session of the same id is another sandbox: it does not see cli-1's files.
    await cli("exec", "--session", "cli-1", "--", "sh", "-c", "echo mine > /workspace/owned");
    await assert.rejects(
      cli("exec", "--session", "cli-1", "--tenant", "other", "--principal", "bob", "--", "cat", "/workspace/owned"),
      (e: { code: number }) => e.code === 1,
    );
    assert.match(
      (await cli("rm", "--session", "cli-1", "--tenant", "other", "--principal", "bob")).stdout,
      /removed the sandbox of cli-1/,
    );
    assert.match((await cli("rm", "--session", "cli-1")).stdout, /removed the sandbox of cli-1/);
    assert.doesNotMatch((await cli("ls")).stdout, new RegExp(key));
  });
});

describe("sandbox abuse and accounting (runc)", () => {
  let stack: Stack;
  let sandbox: Sandbox;
  before(async () => {
    stack = await startStack({ services: ["sandbox"], env: { TROUPE_SANDBOX_POOL: "1" } });
    sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
  });
  after(async () => {
    sandbox?.close();
    await stack?.stop();
  });

  test("#2 thread bomb: held by the pids limit, killed at the timeout, the sandbox still answers", async (t) => {
    // A real pthread bomb, compiled here and written into the workspace (busybox has no threads).
    const { readFile, writeFile } = await import("node:fs/promises");
    const path = await import("node:path");
    const dir = await tempDir(t, "troupe-threads-");
    const src = path.join(dir, "bomb.c");
    await writeFile(
      src,
      '#include <pthread.h>\n#include <stdio.h>\n#include <unistd.h>\nstatic void *idle(void *a) { (void)a; for (;;) pause(); }\nint main(void) { int n = 0; pthread_t t; while (n < 100000 && pthread_create(&t, 0, idle, 0) == 0) n++; printf("threads=%d\\n", n); fflush(stdout); for (;;) pause(); }\n',
    );
    await run("gcc", ["-static", "-O2", "-pthread", "-o", path.join(dir, "bomb"), src]);
    await sandbox.writeFile({
      sessionId: "abuse-threads",
      path: "bomb",
      data: await readFile(path.join(dir, "bomb")),
      mode: 0o755,
    });
    const r = await exec(sandbox, "abuse-threads", "./bomb", { timeoutMs: 3000 });
    const threads = Number(/threads=(\d+)/.exec(r.out)?.[1]);
    assert.ok(threads > 0 && threads < 256, `the pids limit stopped it at ${threads} threads`);
    assert.ok(r.exit.timedOut);
    assert.equal((await exec(sandbox, "abuse-threads", "echo alive")).out, "alive\n");
    await sandbox.releaseSandbox({ sessionId: "abuse-threads" });
  });

  test("#35 API abuse: hundreds of concurrent commands, an oversized write, garbage on the port", async () => {
    const id = "abuse-api";
    await exec(sandbox, id, "true");
    // More commands at once than a sandbox runs (64): the rest are refused, none is lost.
    const outcomes = await Promise.all(
      Array.from({ length: 300 }, () =>
        exec(sandbox, id, "sleep 1; echo done").then(
          (r) => (r.out === "done\n" ? "done" : `odd: ${r.out}`),
          (e: { code: number }) => Status[e.code],
        ),
      ),
    );
    const counts = outcomes.reduce<Record<string, number>>((m, o) => ((m[o] = (m[o] ?? 0) + 1), m), {});
    assert.deepEqual(Object.keys(counts).sort(), ["RESOURCE_EXHAUSTED", "done"], JSON.stringify(counts));
    assert.ok(counts.done >= 32, JSON.stringify(counts));
    // Over the message limit: refused by the transport before it reaches the sandbox.
    await failsWith(
      sandbox.writeFile({ sessionId: id, path: "big", data: Buffer.alloc(5 * 1024 * 1024) }),
      Status.RESOURCE_EXHAUSTED,
    );
    // Bytes that are not HTTP/2 at all.
    const net = await import("node:net");
    const [host, port] = stack.addr.sandbox.split(":");
    await new Promise<void>((resolve) => {
      const sock = net.connect(Number(port), host, () =>
        sock.end(Buffer.from("GET / HTTP/1.1\r\n\r\n\x00\xff garbage")),
      );
      sock.on("error", () => resolve());
      sock.on("close", () => resolve());
      sock.resume();
    });
    assert.equal((await exec(sandbox, id, "echo still")).out, "still\n");
    const health = createClient(Health, stack.addr.sandbox);
    assert.equal((await health.check({ service: "" })).status, Serving.SERVING);
    health.close();
    await sandbox.releaseSandbox({ sessionId: id });
  });

  test("a command cannot signal the agent or open its channel; a dead agent ends only its own sandbox", async () => {
    await sandbox.writeFile({ sessionId: "abuse-agent", path: "f", data: Buffer.from("x") });
    // The agent is PID 1 and another user than every command: no signal, no /proc/1/fd.
    const r = await exec(
      sandbox,
      "abuse-agent",
      "kill -9 1 2>/dev/null && echo KILLED; kill -9 $PPID 2>/dev/null && echo KILLED-PARENT; (echo x > /proc/1/fd/1) 2>/dev/null && echo WROTE; echo end",
    );
    assert.equal(r.out, "end\n");
    assert.equal((await exec(sandbox, "abuse-agent", "cat f")).out, "x", "the same sandbox serves on");
    // Killed from outside (the engine), the agent takes only its own sandbox along, and the
    // service says so with the engine's exit code (nothing else tells an operator why).
    const name = sessionContainer(stack.dataDir, "abuse-agent");
    await run("docker", ["kill", name]);
    await waitFor("the warning", async () => stack.logs().includes(`sandbox ${name} ended on its own`), 10_000, 50);
    const warning = stack
      .logs()
      .split("\n")
      .find((l) => l.includes(`sandbox ${name} ended on its own`))!;
    assert.match(warning, /"exitCode":"137"/);
    assert.match(warning, /"scope":"session:local\.dev\.abuse-agent"/);
    await waitFor(
      "a new sandbox",
      async () => (await exec(sandbox, "abuse-agent", "ls").catch(() => ({ out: "failed" }))).out === "",
      20_000,
      200,
    );
    assert.equal((await exec(sandbox, "abuse-ok", "echo fine")).out, "fine\n");
    await sandbox.releaseSandbox({ sessionId: "abuse-agent" });
    await sandbox.releaseSandbox({ sessionId: "abuse-ok" });
  });

  test("nothing leaks: after releases and a shutdown, the instance has no container left", async () => {
    const count = async () => (await sandboxContainers(stack.dataDir)).length;
    for (const id of ["leak-1", "leak-2", "leak-3"]) {
      await exec(sandbox, id, "echo hi > f; sleep 0.1");
      await exec(sandbox, id, "sleep 30", { timeoutMs: 300 });
    }
    assert.ok((await count()) >= 3);
    for (const id of ["leak-1", "leak-2", "leak-3"])
      assert.equal((await sandbox.releaseSandbox({ sessionId: id })).removed, true);
    // A release is asked for: its container's end is no warning.
    await new Promise((r) => setTimeout(r, 500));
    for (const id of ["leak-1", "leak-2", "leak-3"]) {
      const name = sessionContainer(stack.dataDir, id);
      assert.ok(!stack.logs().includes(`sandbox ${name} ended on its own`), `${id} was released, not lost`);
    }
    await stack.kill("sandbox");
    assert.equal(await count(), 0, "the pool is removed at shutdown, and every released sandbox is gone");
    await stack.start("sandbox");
  });
});
