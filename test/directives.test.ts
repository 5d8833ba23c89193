// Chat directives delivered by an adapter: /model, /think, /status, /new and /reset act on the
// session and are answered in DeliverResponse.directive_reply; they never reach the model; a
// sender without command rights sends them as text; misuse is answered, not an error.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { InboundMessageSchema } from "../services/shared/gen/troupe/v1/inbound_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { subscribeUntil } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

type Inbound = MessageInitShape<typeof InboundMessageSchema>;
let stack: Stack;
let dataDir: string;
let adapter: Awaited<ReturnType<Stack["gatewayAs"]>>;
let n = 0;

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-directives-"));
  await mkdir(path.join(dataDir, "agents", "main"), { recursive: true });
  await writeFile(path.join(dataDir, "agents", "main", "agent.json"), JSON.stringify({ models: ["scripted-2"] }));
  // A session per sender (the default puts every direct chat in the agent's main session).
  await writeFile(path.join(dataDir, "routing.json"), JSON.stringify({ session: { dmScope: "per-channel-peer" } }));
  stack = await startStack({ dataDir, services: ["model-server", "router", "memory", "runner", "gateway"] });
  adapter = await stack.gatewayAs("local", "dev", {}, { role: "adapter", channels: ["telegram"] });
});
after(async () => {
  adapter?.close();
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

/** A message from Telegram user `sender`, allowed commands unless said otherwise. */
const say = (sender: string, text: string, commandAuthorized = true) =>
  adapter.deliver({
    message: {
      idempotencyKey: `tg-${++n}`,
      context: { channel: "telegram", accountId: "bot", sender: { id: sender } },
      text,
      commandAuthorized,
    } satisfies Inbound,
  });

const history = async (sessionId: string) => (await stack.gateway.getHistory({ sessionId })).messages;
const answers = (sessionId: string, k: number) =>
  waitFor(`${k} answers in ${sessionId}`, async () => {
    const h = await history(sessionId);
    return h.filter((m) => m.role === Role.ASSISTANT).length >= k && h;
  });
const agentStarts = async (sessionId: string, runs: number) =>
  (await subscribeUntil(stack.gateway, sessionId, 0n, runs)).flatMap((e) =>
    e.payload.case === "agentStart" ? [e.payload.value.model] : [],
  );

test("/model and /think change the session's next run; /status reports them; none reaches the model", async () => {
  const first = await say("501", "hello");
  assert.equal(first.directiveReply, "");
  await answers(first.sessionId, 1);

  const model = await say("501", "/model scripted-2");
  assert.equal(model.sessionId, first.sessionId);
  assert.equal(model.directiveReply, "Model set to scripted-2.");
  assert.equal(model.accepted, undefined, "a directive is not a message of the session");
  const think = await say("501", "/think HIGH");
  assert.equal(think.directiveReply, "Reasoning effort set to high.");
  const status = await say("501", "/status@troupe_bot");
  assert.match(status.directiveReply, /agent main, model scripted-2, reasoning effort high/);
  assert.match(status.directiveReply, /idle, 0 waiting/);
  assert.match(status.directiveReply, /2 of 2 messages in context; tokens \d+ in, \d+ out/);

  await say("501", "again");
  const h = await answers(first.sessionId, 2);
  assert.deepEqual(
    h.filter((m) => m.role === Role.USER).map((m) => m.text),
    ["hello", "again"],
    "directives are not in the history",
  );
  assert.deepEqual(await agentStarts(first.sessionId, 2), ["scripted-1", "scripted-2"], "the next run used it");

  const refused = await say("501", "/model someone/else");
  assert.match(refused.directiveReply, /^Not changed: .*someone\/else is not one agent main allows/);
  const usage = await say("501", "/think very hard");
  assert.match(usage.directiveReply, /^usage: \/think minimal\|low\|medium\|high\|default/);
  const back = await say("501", "/think off");
  assert.equal(back.directiveReply, "Reasoning effort back to the agent's.");
});

test("/new starts the conversation over: the model sees nothing before it, the history keeps it", async () => {
  const first = await say("502", "my secret word is pelican");
  await answers(first.sessionId, 1);
  const reset = await say("502", "/new");
  assert.equal(reset.directiveReply, "Started a new conversation; the old one stays in the history.");
  const status = await say("502", "/status");
  assert.match(status.directiveReply, /0 of 2 messages in context/);
  // The scripted model answers "!first" with the first message it was sent after the system prompt.
  await say("502", "!first");
  const h = await answers(first.sessionId, 2);
  const last = h.filter((m) => m.role === Role.ASSISTANT).at(-1)!.text;
  assert.doesNotMatch(last, /pelican/, `the model was sent the old conversation: ${last}`);
  assert.match(last, /!first/);
  assert.equal(h[0].text, "my secret word is pelican", "the history keeps it");
});

test("a sender without command rights sends a directive as text; an unknown one is text too", async () => {
  const plain = await say("503", "/status", false);
  assert.equal(plain.directiveReply, "");
  assert.ok(plain.accepted, "it went to the session as a message");
  const unknown = await say("503", "/weather tomorrow");
  assert.equal(unknown.directiveReply, "");
  const h = await answers(plain.sessionId, 2);
  assert.deepEqual(
    h.filter((m) => m.role === Role.USER).map((m) => m.text),
    ["/status", "/weather tomorrow"],
  );
});
