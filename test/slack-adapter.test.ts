// `troupe adapter slack` against a Slack written from its references (helpers/slack-api.ts): the
// Events API URL check, direct messages and mentions answered in the right place (a mention's
// reply in its thread), replies streamed by chat.update, Slack's retries of one event answered
// once, forged or stale requests refused, images shared with a message reaching the session, and
// an adapter killed mid-reply finishing that reply in place after a restart.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { startAdapter, type AdapterProcess } from "./helpers/adapter.js";
import { SlackServer } from "./helpers/slack-api.js";
import { freePort, startStack, waitFor, type Stack } from "./helpers/stack.js";

const TOKEN = "xoxb-test-token";
const SECRET = "8f742231b10e8888abcd99yyyzzz85a5";
const DM = "D0DM00001";
const GENERAL = "C0GENERAL";
const STRANGER_DM = "D0DM00002";
/** A conversation of Alice's where a tool call waits for her (its own session: per-channel-peer). */
const APPROVALS_DM = "D0DM00003";
let stack: Stack;
let dataDir: string;
let slack: SlackServer;
let apiUrl: string;
let adapterKey: string;
let eventsUrl: string;
let adapter: AdapterProcess | undefined;

const start = async (env: NodeJS.ProcessEnv = {}) => {
  adapter = await startAdapter(
    "slack",
    {
      TROUPE_API_KEY: adapterKey,
      TROUPE_GATEWAY_ADDR: stack.addr.gateway,
      TROUPE_DATA_DIR: dataDir,
      TROUPE_WEBHOOK_ADDR: new URL(eventsUrl).host,
      SLACK_BOT_TOKEN: TOKEN,
      SLACK_SIGNING_SECRET: SECRET,
      SLACK_API_URL: apiUrl,
      TROUPE_ADAPTER_COMMAND_USERS: "U0ALICE01",
      ...env,
    },
    /slack adapter taking events/,
  );
};

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-slack-"));
  await writeFile(path.join(dataDir, "routing.json"), JSON.stringify({ session: { dmScope: "per-channel-peer" } }));
  // Listing schedules waits for a person's approval (docs/approvals.md).
  await mkdir(path.join(dataDir, "agents", "main"), { recursive: true });
  await writeFile(
    path.join(dataDir, "agents", "main", "agent.json"),
    JSON.stringify({ approvals: { tools: { manage_schedule: "ask" } } }),
  );
  stack = await startStack({ dataDir, services: ["model-server", "router", "memory", "runner", "gateway"] });
  adapterKey = await stack.keyFor("local", "slack-app", { role: "adapter", channels: ["slack"] });
  slack = new SlackServer(TOKEN, SECRET, new Set([DM, GENERAL, STRANGER_DM, APPROVALS_DM]));
  apiUrl = await slack.start();
  eventsUrl = `http://127.0.0.1:${await freePort()}/slack/events`;
  await start();
});
after(async () => {
  await adapter?.kill("SIGTERM");
  await slack?.stop();
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

const dm = (text: string, extra: object = {}) => {
  const ts = slack.nextTs();
  return { ts, event: { type: "message", channel: DM, channel_type: "im", user: "U0ALICE01", text, ts, ...extra } };
};
const settles = (channel: string, n: number, last: RegExp, thread?: string, ms = 30_000) =>
  waitFor(
    `${n} bot messages in ${channel}, the last ${last}`,
    async () => {
      const msgs = slack.botMessages(channel, thread);
      return msgs.length === n && last.test(msgs.at(-1)!.versions.at(-1)!) && msgs;
    },
    ms,
  );
const last = (m: { versions: string[] }) => m.versions.at(-1)!;
const tokens = (n: number) => Array.from({ length: n }, (_, i) => `t${i + 1}`).join(" ");

test("the Events API's URL check is answered with its challenge", async () => {
  assert.equal(await slack.verifyUrl(eventsUrl), true);
});

test("a direct message is answered in the DM, streamed by chat.update", async () => {
  const { event } = dm("!tokens 40 rate=10");
  await slack.sendEvent(eventsUrl, event);
  const [reply] = await settles(DM, 1, new RegExp(`^${tokens(40)}\\s*$`));
  assert.equal(reply!.thread_ts, undefined, "a DM's reply is not put in a thread");
  assert.ok(
    reply!.versions.length >= 3 && reply!.versions.length <= 9,
    `edits at a bounded rate: ${reply!.versions.length}`,
  );
  assert.deepEqual(slack.refusals, []);
});

test("a mention in a channel is answered in its thread, without the mention; the thread is followed; other talk is not", async () => {
  const ts = slack.nextTs();
  // Slack sends a mention as both a channel message and an app_mention.
  const text = `<@${slack.botUser}> hello team`;
  await slack.sendEvent(eventsUrl, {
    type: "message",
    channel: GENERAL,
    channel_type: "channel",
    user: "U0BOB0001",
    text,
    ts,
  });
  await slack.sendEvent(eventsUrl, { type: "app_mention", channel: GENERAL, user: "U0BOB0001", text, ts });
  await slack.sendEvent(eventsUrl, {
    type: "message",
    channel: GENERAL,
    channel_type: "channel",
    user: "U0BOB0001",
    text: "just us here",
    ts: slack.nextTs(),
  });
  const [reply] = await settles(GENERAL, 1, /^You said: hello team/, ts);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(slack.botMessages(GENERAL).length, 1, "one answer: the mention, once");
  assert.equal(reply!.thread_ts, ts);
  // In the thread it answered in, the bot follows without being mentioned; in another thread it does not.
  const inThread = { type: "message", channel: GENERAL, channel_type: "channel", user: "U0BOB0001", thread_ts: ts };
  await slack.sendEvent(eventsUrl, { ...inThread, text: "and one more thing", ts: slack.nextTs() });
  await slack.sendEvent(eventsUrl, {
    ...inThread,
    thread_ts: "1700000000.000100",
    text: "elsewhere",
    ts: slack.nextTs(),
  });
  await settles(GENERAL, 2, /^You said: and one more thing/, ts);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(slack.botMessages(GENERAL).length, 2);
});

test("Slack's retries of an event are one message, answered once; a bot's own message is ignored", async () => {
  const { event } = dm("once only");
  const before = slack.botMessages(DM).length;
  await slack.sendEvent(eventsUrl, event);
  const res = await slack.post(
    eventsUrl,
    { type: "event_callback", team_id: slack.team, event },
    { "x-slack-retry-num": "1", "x-slack-retry-reason": "http_timeout" },
  );
  assert.equal(res.status, 200);
  await slack.sendEvent(eventsUrl, { ...dm("from a bot").event, bot_id: "B0OTHER01", user: "U0OTHERBT" });
  await settles(DM, before + 1, /^You said: once only/);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(slack.botMessages(DM).length, before + 1);
});

test("a stranger's direct message gets a pairing code in the DM and reaches no agent", async () => {
  const ts = slack.nextTs();
  await slack.sendEvent(eventsUrl, {
    type: "message",
    channel: STRANGER_DM,
    channel_type: "im",
    user: "U0STRANGE",
    text: "let me in",
    ts,
  });
  const [told] = await settles(STRANGER_DM, 1, /Your pairing code is [A-Z2-9]{8}/);
  assert.equal(told!.thread_ts, undefined);
  const gw = await stack.gatewayAs("local", "slack-app");
  try {
    const sessions = (await gw.listSessions({})).sessions.map((s) => s.sessionId.toLowerCase());
    assert.ok(!sessions.some((id) => id.includes("u0strange")), sessions.join(", "));
  } finally {
    gw.close();
  }
});

test("forged and stale requests are refused and reach no agent", async () => {
  const before = slack.botMessages(DM).length;
  const { event } = dm("forged");
  const forged = await slack.post(eventsUrl, { type: "event_callback", event }, {}, (b) =>
    b.replace("forged", "FORGED"),
  );
  assert.equal(forged.status, 401);
  const stale = await slack.post(
    eventsUrl,
    { type: "event_callback", event },
    { "x-slack-request-timestamp": "1500000000" },
  );
  assert.equal(stale.status, 401);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(slack.botMessages(DM).length, before);
});

test("an image shared in a DM is downloaded with the token and reaches the session", async () => {
  const png = Buffer.from("89504e470d0a1a0a0000000d4948445200000001", "hex");
  const url = slack.addFile("F0IMG0001", png);
  const { event } = dm("see this", {
    subtype: "file_share",
    files: [{ id: "F0IMG0001", name: "shot.png", mimetype: "image/png", size: png.length, url_private: url }],
  });
  const before = slack.botMessages(DM).length;
  await slack.sendEvent(eventsUrl, event);
  const msgs = await settles(DM, before + 1, /^You said: see this/);
  assert.match(last(msgs.at(-1)!), /\[image: shot\.png \(image\/png/);
  const gw = await stack.gatewayAs("local", "slack-app");
  try {
    const session = (await gw.listSessions({})).sessions.find(
      (s) => s.sessionId.includes("u0alice01") || s.sessionId.includes("U0ALICE01"),
    )!;
    const withImages = (await gw.getHistory({ sessionId: session.sessionId })).messages.filter(
      (m) => m.images.length > 0,
    );
    assert.equal(withImages.at(-1)!.images[0]!.mimeType, "image/png");
  } finally {
    gw.close();
  }
});

test("killed mid-reply and started again: the reply is finished in place, nothing doubled", async () => {
  const before = slack.botMessages(DM).length;
  await slack.sendEvent(eventsUrl, dm("!tokens 60 rate=10").event);
  await waitFor("the draft is showing", async () => slack.botMessages(DM).length === before + 1);
  await adapter!.kill("SIGKILL");
  await start();
  const msgs = await settles(DM, before + 1, new RegExp(`^${tokens(60)}\\s*$`));
  await new Promise((r) => setTimeout(r, 2000));
  assert.equal(slack.botMessages(DM).length, before + 1);
  assert.equal(last(msgs.at(-1)!).trim(), tokens(60));
});

test("a tool call held for approval is asked with buttons; a click in the DM decides it once", async () => {
  const ts = slack.nextTs();
  await slack.sendEvent(eventsUrl, {
    type: "message",
    channel: APPROVALS_DM,
    channel_type: "im",
    user: "U0ALICE01",
    text: '!call manage_schedule {"action": "list"}',
    ts,
  });
  const question = await waitFor("the question with its buttons", async () =>
    slack.botMessages(APPROVALS_DM).find((m) => m.blocks?.some((b) => b.type === "actions")),
  );
  assert.match(last(question), /manage_schedule/);
  // A forged click (a signature that does not match) is refused and decides nothing.
  const forged = await fetch(eventsUrl, {
    method: "POST",
    headers: {
      "content-type": "application/x-www-form-urlencoded",
      "x-slack-request-timestamp": String(Math.floor(Date.now() / 1000)),
      "x-slack-signature": "v0=00",
    },
    body: "payload=%7B%7D",
  });
  assert.equal(forged.status, 401);
  assert.ok(
    question.blocks?.some((b) => b.type === "actions"),
    "still asking",
  );
  const status = await slack.click(eventsUrl, {
    user: "U0ALICE01",
    channel: APPROVALS_DM,
    message: question,
    actionId: "troupe_approve",
  });
  assert.equal(status, 200);
  await waitFor("the run's reply", async () =>
    slack.botMessages(APPROVALS_DM).some((m) => /Tool results: \(no schedules\)/.test(last(m))),
  );
  assert.match(last(question), /Approved by <@U0ALICE01>\.$/);
  assert.ok(!question.blocks?.some((b) => b.type === "actions"), "a decided question has no buttons");
  // A second click on the old buttons changes nothing.
  assert.equal(
    await slack.click(eventsUrl, {
      user: "U0ALICE01",
      channel: APPROVALS_DM,
      message: question,
      actionId: "troupe_reject",
    }),
    200,
  );
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(slack.botMessages(APPROVALS_DM).filter((m) => /Tool results/.test(last(m))).length, 1, "run once");
  assert.deepEqual(slack.refusals, []);
});

test("a bot token Slack refuses stops the adapter with the reason", async () => {
  await assert.rejects(
    startAdapter(
      "slack",
      {
        TROUPE_API_KEY: adapterKey,
        TROUPE_GATEWAY_ADDR: stack.addr.gateway,
        TROUPE_DATA_DIR: dataDir,
        TROUPE_ADAPTER_STATE: path.join(dataDir, "other.json"),
        TROUPE_WEBHOOK_ADDR: `127.0.0.1:${await freePort()}`,
        SLACK_BOT_TOKEN: "xoxb-wrong",
        SLACK_SIGNING_SECRET: SECRET,
        SLACK_API_URL: apiUrl,
      },
      /taking events/,
    ),
    /refused SLACK_BOT_TOKEN \(invalid_auth\)/,
  );
});
