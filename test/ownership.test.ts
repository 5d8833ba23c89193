// One live actor per session with two runners sharing a store: the router places sessions, the
// store's lease refuses a second activation (and the gateway follows the refusal to the owner),
// and an owner presumed dead is fenced: what it writes after the takeover does not count.
import { sessionLogPath } from "../services/runner/store/jsonl-session-store.js";
import { refOf } from "../services/shared/session-ref.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../services/shared/gen/troupe/v1/runner_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { SESSION_OWNER_KEY, Status } from "../services/shared/errors.js";
import type { grpc, ServiceClient } from "../services/shared/rpc.js";
import { LEGACY_OWNER } from "../services/runner/session/session-log.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
let addrA: string;
let addrB: string;
let runnerA: ServiceClient<(typeof RunnerService)["method"]>;
let runnerB: ServiceClient<(typeof RunnerService)["method"]>;
let router: ServiceClient<(typeof RouterService)["method"]>;

before(async () => {
  stack = await startStack({
    services: ["model-server", "router", "runner", "gateway"],
    env: { TROUPE_RUNNER_LIVENESS_MS: "1500", TROUPE_MEMORY_CONTEXT_K: "0" },
  });
  addrA = stack.addr.runner;
  addrB = await stack.startInstance("runner-b", "runner", { args: ["--runner-id", "runner-b"] });
  router = stack.client(RouterService, stack.addr.router, { as: DEV_IDENTITY });
  await waitFor("both runners to register", async () => (await router.listRunners({})).runners.length === 2);
  // As the gateway calls them: internal token, on behalf of the development key's identity.
  runnerA = stack.client(RunnerService, addrA, { as: LEGACY_OWNER });
  runnerB = stack.client(RunnerService, addrB, { as: LEGACY_OWNER });
});
after(async () => {
  for (const c of [runnerA, runnerB, router]) c?.close();
  await stack?.stop();
});

/** A fresh session id that the router places on the runner at `address`. */
async function sessionPlacedOn(address: string, prefix: string): Promise<string> {
  for (let i = 0; i < 200; i++) {
    const res = await router.resolveSession({ sessionId: `${prefix}-${i}` });
    if (res.runner?.address === address) return res.sessionId;
  }
  throw new Error(`no session id placed on ${address}`);
}

const prompt = (sessionId: string, text: string) => ({
  sessionId,
  frame: { frameId: `p-${Math.random().toString(36).slice(2)}`, kind: { case: "prompt" as const, value: { text } } },
});

async function historyOf(client: typeof runnerA, sessionId: string): Promise<string[]> {
  return (await client.readHistory({ sessionId })).messages.map((m) => `${Role[m.role]}:${m.text}`);
}

/** Asserts a call was refused as "live elsewhere", and returns the owner address it named. */
function refusal(err: unknown): string | undefined {
  const e = err as grpc.ServiceError;
  assert.equal(e.code, Status.ABORTED, `expected ABORTED, got ${e.code}: ${e.details}`);
  const owner = e.metadata?.get(SESSION_OWNER_KEY)[0];
  return typeof owner === "string" ? owner : undefined;
}

const epochRecords = async (sessionId: string) =>
  (await readFile(sessionLogPath(stack.dataDir, refOf(DEV_IDENTITY, sessionId)), "utf8"))
    .split("\n")
    .filter((l) => l.includes('"t":"epoch"')).length;

test("a session live on one runner is refused by the other, which names the owner", async () => {
  const sid = await sessionPlacedOn(addrA, "own-a");
  await stack.gateway.createSession({ sessionId: sid });
  await stack.gateway.sendMessage({ sessionId: sid, frameId: "m1", text: "hello" });
  await waitFor("the reply", async () => (await historyOf(runnerA, sid)).includes("ASSISTANT:You said: hello"));

  await assert.rejects(runnerB.ensureSession({ open: { sessionId: sid } }), (err) => refusal(err) === addrA);
  await assert.rejects(runnerB.submit(prompt(sid, "sneaking in")), (err) => refusal(err) === addrA);
  await assert.rejects(runnerB.readHistory({ sessionId: sid }), (err) => refusal(err) === addrA);
  assert.equal(await epochRecords(sid), 1, "the refused activations left nothing in the log");

  // The owner serves on, untouched.
  await stack.gateway.sendMessage({ sessionId: sid, frameId: "m2", text: "still here" });
  await waitFor("the second reply", async () =>
    (await historyOf(runnerA, sid)).includes("ASSISTANT:You said: still here"),
  );
  assert.deepEqual(await historyOf(runnerA, sid), [
    "USER:hello",
    "ASSISTANT:You said: hello",
    "USER:still here",
    "ASSISTANT:You said: still here",
  ]);
});

test("the gateway follows a refusal to the runner that owns the session", async () => {
  // Placed on A by the router, but live on B (as after a placement change while B kept running).
  const sid = await sessionPlacedOn(addrA, "moved");
  await runnerB.ensureSession({ open: { sessionId: sid, create: true } });

  const s = new ChatSession(stack.gateway);
  s.open(sid, false);
  await s.waitOpened();
  s.prompt("over there");
  await s.waitFor((e) => e.payload.case === "agentEnd");
  s.close();
  assert.deepEqual(await historyOf(runnerB, sid), ["USER:over there", "ASSISTANT:You said: over there"]);
  const history = await stack.gateway.getHistory({ sessionId: sid });
  assert.equal(history.messages.length, 2);
  await assert.rejects(runnerA.readHistory({ sessionId: sid }), (err) => refusal(err) === addrB);
});

test("an owner presumed dead is fenced: its session moves, and its late writes do not count", async () => {
  const sid = await sessionPlacedOn(addrB, "fence");
  await stack.gateway.createSession({ sessionId: sid });
  await stack.gateway.sendMessage({ sessionId: sid, frameId: "b1", text: "before" });
  // The turn's end is synced to the log (what a takeover reads) shortly after clients see it.
  const logFile = sessionLogPath(stack.dataDir, refOf(DEV_IDENTITY, sid));
  await waitFor("the turn on B to be in the log", async () => (await readFile(logFile, "utf8")).includes('"agentEnd"'));

  // B stops answering (a long pause, a partition) but is not dead: its actor stays in memory.
  stack.process("runner-b")!.kill("SIGSTOP");
  try {
    // While B's heartbeat is fresh A refuses; once it is stale (1.5 s here) A takes the session.
    const started = Date.now();
    await waitFor(
      "A to take the session over",
      async () => (await runnerA.ensureSession({ open: { sessionId: sid } })).session,
      10_000,
      200,
    );
    assert.ok(Date.now() - started >= 500, "not before B's heartbeat went stale");
    await runnerA.submit(prompt(sid, "after the takeover"));
    await waitFor("the reply on A", async () => (await historyOf(runnerA, sid)).length === 4);
  } finally {
    stack.process("runner-b")!.kill("SIGCONT");
  }

  // B wakes up with the session still in memory. Its next write finds its lease gone: refused,
  // and the actor leaves; the next call finds A's live lease and is pointed there.
  await assert.rejects(runnerB.submit(prompt(sid, "stale write")), (err) => (refusal(err), true));
  await assert.rejects(runnerB.submit(prompt(sid, "stale write 2")), (err) => refusal(err) === addrA);
  assert.deepEqual(await historyOf(runnerA, sid), [
    "USER:before",
    "ASSISTANT:You said: before",
    "USER:after the takeover",
    "ASSISTANT:You said: after the takeover",
  ]);

  // The gateway still has B cached for this session: it is refused there and follows to A.
  await stack.gateway.sendMessage({ sessionId: sid, frameId: "g1", text: "via the gateway" });
  await waitFor("the gateway's prompt on A", async () =>
    (await historyOf(runnerA, sid)).includes("ASSISTANT:You said: via the gateway"),
  );
  const all = await historyOf(runnerA, sid);
  assert.ok(!all.some((m) => m.includes("stale write")), "nothing B wrote after the takeover counts");
});

test("a session stream is an AttachMany sub-stream only: Attach on its own is refused UNIMPLEMENTED", async () => {
  const call = runnerA.attach() as unknown as grpc.ClientDuplexStream<unknown, unknown>;
  const status = await new Promise<grpc.StatusObject>((resolve) => {
    call.on("status", resolve);
    call.on("error", () => undefined);
    call.on("data", () => assert.fail("Attach answered a session stream"));
  });
  assert.equal(status.code, Status.UNIMPLEMENTED);
  assert.match(status.details, /AttachMany/);
  call.end();
});
