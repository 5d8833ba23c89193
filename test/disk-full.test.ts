// A full disk under a running stack: the runner's data directory is a small tmpfs of its own
// (mounted here; the tests run as root, as CI does), filled to the last byte while a session is
// live. What was acknowledged stays, a message that cannot be written is refused (UNAVAILABLE,
// to be resent), and once space is back the session reloads from its log and goes on.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, open, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { Status } from "../services/shared/errors.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
let mount: string;
let stack: Stack;

before(async () => {
  mount = await mkdtemp(path.join(os.tmpdir(), "troupe-full-"));
  await run("mount", ["-t", "tmpfs", "-o", "size=8m", "tmpfs", mount]);
  stack = await startStack({
    dataDir: mount,
    services: ["model-server", "router", "runner", "gateway"],
    env: { TROUPE_MEMORY_CONTEXT_K: "0", TROUPE_MEMORY_LEARN: "0" },
  });
});
after(async () => {
  await stack?.stop();
  await run("umount", [mount]).catch(() => undefined);
  await rm(mount, { recursive: true, force: true });
});

/** Writes zeros into `file` until the filesystem has no byte left. */
async function fill(file: string): Promise<void> {
  const fh = await open(file, "w");
  const chunk = Buffer.alloc(64 * 1024);
  try {
    for (;;) await fh.write(chunk);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
  } finally {
    await fh.close();
  }
  // The last partial chunk's room, to the byte.
  const tail = await open(file, "a");
  try {
    for (;;) await tail.write(Buffer.alloc(1));
  } catch {
    // full
  } finally {
    await tail.close();
  }
}

const replies = async (sessionId: string) =>
  (await stack.gateway.getHistory({ sessionId })).messages.filter((m) => m.role === Role.ASSISTANT).map((m) => m.text);

test("a full disk refuses what cannot be written; once space is back the session reloads and goes on", async () => {
  await stack.gateway.createSession({ sessionId: "full-1" });
  await stack.gateway.sendMessage({ sessionId: "full-1", frameId: "f1", text: "before" });
  await waitFor("the first reply", async () => (await replies("full-1")).includes("You said: before"));

  const filler = path.join(mount, "filler");
  await fill(filler);
  // Larger than the slack of a file's last page (tmpfs pages are 4 KiB): the record needs new pages.
  const during = `during ${"x".repeat(20_000)}`;
  // The log cannot take the frame: refused, never acknowledged (the client resends).
  await assert.rejects(
    stack.gateway.sendMessage({ sessionId: "full-1", frameId: "f2", text: during }),
    (e: { code: number; details: string }) => {
      assert.equal(e.code, Status.UNAVAILABLE, e.details);
      return true;
    },
  );

  await rm(filler);
  // Space is back: the same frame, resent, is taken and answered; nothing acknowledged was lost.
  await waitFor("the resent message to be taken", async () =>
    stack.gateway.sendMessage({ sessionId: "full-1", frameId: "f2", text: during }).then(
      () => true,
      () => false,
    ),
  );
  await waitFor("its reply", async () => (await replies("full-1")).includes(`You said: ${during}`));
  const texts = (await stack.gateway.getHistory({ sessionId: "full-1" })).messages.map((m) => m.text);
  assert.deepEqual(texts, ["before", "You said: before", during, `You said: ${during}`]);
  // And the runner serves other sessions throughout.
  await stack.gateway.createSession({ sessionId: "full-2" });
});
