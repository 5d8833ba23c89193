// `troupe chat` across restarts behind it, as `troupe up` restarts a service that died: the
// stream is made again, the turn's events go on from the last one seen, the prompt runs once,
// and the command exits 0 when the turn completes.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { JsonlSessionStore } from "../services/runner/store/jsonl-session-store.js";
import { refOf } from "../services/shared/session-ref.js";
import { MAIN, startStack, waitFor, type Stack } from "./helpers/stack.js";
import { tokensReply } from "./helpers/session.js";

let stack: Stack;
before(async () => {
  stack = await startStack({ env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" } });
});
after(() => stack?.stop());

/** `troupe chat --session <id> <prompt>` started, with what it has printed so far. */
function chat(session: string, prompt: string) {
  const proc = spawn(
    process.execPath,
    [MAIN, "chat", "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway, "--session", session, prompt],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  const got = { out: "", err: "" };
  proc.stdout.on("data", (d) => (got.out += d));
  proc.stderr.on("data", (d) => (got.err += d));
  const exited = new Promise<number | null>((resolve) => proc.once("exit", resolve));
  return { proc, got, exited };
}

test("a gateway restarted mid-turn: every token arrives once, and the command exits 0", async () => {
  const c = chat("reconnect-gateway", "!tokens 60 rate=20");
  await waitFor("the reply to stream", async () => c.got.out.includes("t5 "), 20_000);
  await stack.kill("gateway", "SIGKILL");
  await new Promise((r) => setTimeout(r, 500));
  await stack.start("gateway");
  assert.equal(await c.exited, 0, c.got.err);
  // The runner kept the turn's events: the replay after the last one seen leaves no hole.
  assert.equal(c.got.out, `${tokensReply(60)}\n`);
  assert.match(c.got.err, /\[connection lost \(UNAVAILABLE: [^)]*\); reconnecting\]/);
  assert.match(c.got.err, /\[reconnected to session reconnect-gateway\]/);
  assert.doesNotMatch(c.got.err, /not kept/);
});

test("a turn that ends while the gateway is down: what the replay no longer holds comes from the complete message", async () => {
  const c = chat("reconnect-gap", "!tokens 300 rate=100");
  await waitFor("the reply to stream", async () => c.got.out.includes("t5 "), 20_000);
  await stack.kill("gateway", "SIGKILL");
  // The run ends unwatched; the idle session keeps only its last events in memory (a gap for us).
  const log = new JsonlSessionStore(stack.dataDir);
  await waitFor(
    "the run to end",
    async () =>
      (await log.read(refOf({ tenant: "local", principal: "dev" }, "reconnect-gap"))).some(
        (r) => r.t === "event" && JSON.stringify(r.event).includes('"agentEnd"'),
      ),
    20_000,
  );
  await stack.start("gateway");
  assert.equal(await c.exited, 0, c.got.err);
  assert.match(c.got.err, /not kept; complete messages follow/);
  assert.equal(c.got.out, `${tokensReply(300)}\n`, "every token once: the streamed part, then the rest of the message");
});

test("a runner killed mid-turn: the run goes on after its restart, the prompt runs once", async () => {
  const c = chat("reconnect-runner", "!tokens 60 rate=20");
  await waitFor("the reply to stream", async () => c.got.out.includes("t5 "), 20_000);
  await stack.kill("runner", "SIGKILL");
  await stack.start("runner");
  assert.equal(await c.exited, 0, c.got.err);
  assert.match(c.got.err, /\[the run goes on after a runner restart\]/);
  // What streamed before the kill stays on a line of its own; the resumed answer is whole.
  const lines = c.got.out.split("\n");
  assert.equal(lines.length, 3, c.got.out);
  assert.ok(lines[0].startsWith("t1 t2 t3 t4 t5 ") && tokensReply(60).startsWith(lines[0]), lines[0]);
  assert.equal(lines[1], tokensReply(60));
  const history = await stack.gateway.getHistory({ sessionId: "reconnect-runner" });
  assert.deepEqual(
    history.messages.map((m) => m.text),
    ["!tokens 60 rate=20", tokensReply(60)],
    "one prompt, one answer",
  );
});

test("Ctrl-C while it waits to reconnect: the first asks for an abort, the second exits", async () => {
  const c = chat("reconnect-cancel", "!tokens 200 rate=20");
  await waitFor("the reply to stream", async () => c.got.out.includes("t3 "), 20_000);
  await stack.kill("gateway", "SIGKILL");
  try {
    await waitFor("it to notice", async () => c.got.err.includes("reconnecting"), 10_000);
    c.proc.kill("SIGINT");
    await new Promise((r) => setTimeout(r, 200));
    c.proc.kill("SIGINT");
    const t0 = Date.now();
    assert.equal(await c.exited, 130);
    assert.ok(Date.now() - t0 < 3000, `exited ${Date.now() - t0} ms after the second Ctrl-C`);
  } finally {
    await stack.start("gateway");
  }
});

test("a session that never opened is not retried: an unreachable gateway fails at once", async () => {
  await stack.kill("gateway", "SIGKILL");
  try {
    const t0 = Date.now();
    const c = chat("reconnect-none", "hi");
    assert.equal(await c.exited, 1);
    assert.ok(Date.now() - t0 < 15_000, `${Date.now() - t0} ms`);
    assert.match(c.got.err, /UNAVAILABLE/);
    assert.match(c.got.err, /make run/);
    assert.doesNotMatch(c.got.err, /reconnecting/);
  } finally {
    await stack.start("gateway");
  }
});
