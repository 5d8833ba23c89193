// `troupe adapter slack` by Socket Mode, against a Slack written from its references
// (helpers/slack-api.ts, helpers/websocket-server.ts): events over a WebSocket the adapter opens,
// each envelope acknowledged on its socket once delivered; Slack's recycling of a connection
// (a new one open before the old closes, nothing sent in between lost), a connection cut without
// notice, an envelope sent again, the gateway away while Slack retries, and the tokens Slack
// refuses.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { startAdapter, type AdapterProcess } from "./helpers/adapter.js";
import { SlackServer } from "./helpers/slack-api.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

const TOKEN = "xoxb-test-token";
const DM = "D0DM00002";
const APPROVALS_DM = "D0DM00003";
let stack: Stack;
let dataDir: string;
let slack: SlackServer;
let apiUrl: string;
let adapterKey: string;
let adapter: AdapterProcess | undefined;

const env = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({
  TROUPE_API_KEY: adapterKey,
  TROUPE_GATEWAY_ADDR: stack.addr.gateway,
  TROUPE_DATA_DIR: dataDir,
  SLACK_BOT_TOKEN: TOKEN,
  SLACK_APP_TOKEN: slack.appToken,
  SLACK_API_URL: apiUrl,
  // Alice writes in private; under the default DM policy (pairing) she is let in by name.
  TROUPE_ADAPTER_ALLOW_FROM: "U0ALICE01",
  ...extra,
});

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-slack-socket-"));
  await writeFile(path.join(dataDir, "routing.json"), JSON.stringify({ session: { dmScope: "per-channel-peer" } }));
  await mkdir(path.join(dataDir, "agents", "main"), { recursive: true });
  await writeFile(
    path.join(dataDir, "agents", "main", "agent.json"),
    JSON.stringify({ approvals: { tools: { manage_schedule: "ask" } } }),
  );
  stack = await startStack({ dataDir, services: ["model-server", "router", "memory", "runner", "gateway"] });
  adapterKey = await stack.keyFor("local", "slack-app", { role: "adapter", channels: ["slack"] });
  slack = new SlackServer(TOKEN, "unused-signing-secret", new Set([DM, APPROVALS_DM]));
  apiUrl = await slack.start();
  adapter = await startAdapter("slack", env(), /slack adapter taking events by Socket Mode/);
});
after(async () => {
  await adapter?.kill("SIGTERM");
  await slack?.stop();
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

const dm = (text: string) => {
  const ts = slack.nextTs();
  return { type: "message", channel: DM, channel_type: "im", user: "U0ALICE01", text, ts };
};
const answered = (n: number, last: RegExp) =>
  waitFor(`${n} bot messages, the last ${last}`, async () => {
    const msgs = slack.botMessages(DM);
    return msgs.length === n && last.test(msgs.at(-1)!.versions.at(-1)!) && msgs;
  });
const quiet = () => new Promise((r) => setTimeout(r, 1500));

test("a direct message comes by Socket Mode, is acknowledged once, and is answered in the DM", async () => {
  assert.equal(slack.connectionsOpened, 1);
  assert.equal(await slack.sendSocketEvent(dm("over the socket")), true);
  await answered(1, /^You said: over the socket/);
  assert.deepEqual(
    slack.socketDeliveries.map((d) => [d.retry, d.acked]),
    [[0, true]],
    "acknowledged the first time",
  );
  assert.deepEqual(slack.refusals, []);
});

test("an envelope Slack sends again is one message, answered once", async () => {
  const before = slack.botMessages(DM).length;
  const event = dm("said twice");
  assert.equal(await slack.sendSocketEvent(event), true);
  assert.equal(await slack.sendSocketEvent(event), true, "the second is acknowledged too");
  await answered(before + 1, /^You said: said twice/);
  await quiet();
  assert.equal(slack.botMessages(DM).length, before + 1);
});

test("a delivery slower than Slack's 3 s: its retry comes while the first is handled, one answer", async () => {
  const before = slack.botMessages(DM).length;
  const attempts = slack.socketDeliveries.length;
  const png = Buffer.from("89504e470d0a1a0a0000000d4948445200000001", "hex");
  const url = slack.addFile("F0SLOW0001", png);
  // The first download takes 4.5 s, so that delivery ends after Slack's 3-s wait; Slack's retry
  // downloads at once and is delivered while the first is still downloading.
  slack.fileDelayMs = 4500;
  const event = {
    ...dm("a slow file"),
    subtype: "file_share",
    files: [{ id: "F0SLOW0001", name: "slow.png", mimetype: "image/png", size: png.length, url_private: url }],
  };
  assert.equal(await slack.sendSocketEvent(event), true, "the retry is acknowledged");
  assert.deepEqual(
    slack.socketDeliveries.slice(attempts).map((d) => [d.retry, d.acked]),
    [
      [0, false],
      [1, true],
    ],
  );
  await answered(before + 1, /^You said: a slow file/);
  await quiet();
  await quiet();
  assert.equal(slack.botMessages(DM).length, before + 1, "both deliveries made one message, answered once");
});

test("a recycled connection: the next is open before the old closes, and what came between is taken", async () => {
  const before = slack.botMessages(DM).length;
  const opened = slack.connectionsOpened;
  const old = slack.liveSocket()!;
  slack.recycle("refresh_requested", 1500);
  // Sent on the old connection after its notice, before it closes.
  assert.equal(await slack.sendSocketEvent(dm("in the overlap"), old), true);
  await waitFor("a new connection", async () => slack.connectionsOpened === opened + 1 && slack.liveSocket() !== old);
  await waitFor("the old one closed", async () => old.closed);
  assert.equal(await slack.sendSocketEvent(dm("on the new one")), true);
  await answered(before + 2, /^You said: on the new one/);
  assert.ok(slack.botMessages(DM).some((m) => /in the overlap/.test(m.versions.at(-1)!)));
});

test("a connection cut without notice is replaced, and Slack's retry of what it missed is answered", async () => {
  const before = slack.botMessages(DM).length;
  const opened = slack.connectionsOpened;
  slack.cutSockets();
  assert.equal(await slack.sendSocketEvent(dm("after the cut")), true);
  await answered(before + 1, /^You said: after the cut/);
  assert.ok(slack.connectionsOpened > opened);
  assert.ok(slack.socketDeliveries.at(-1)!.retry > 0, "the first send met no connection and was retried");
});

test("a connection Slack says no hello on is given up, and the next one is used", async () => {
  const before = slack.botMessages(DM).length;
  const opened = slack.connectionsOpened;
  slack.withholdHello = 1;
  slack.cutSockets();
  await waitFor("a connection with no hello, then another", async () => slack.connectionsOpened >= opened + 2, 30_000);
  await waitFor(
    "the one with no hello closed by the adapter",
    async () => slack.sockets.at(-2)!.closeCode !== undefined,
  );
  assert.equal(await slack.sendSocketEvent(dm("after no hello")), true);
  await answered(before + 1, /^You said: after no hello/);
});

test("with the gateway away nothing is acknowledged; Slack's retries reach it once it is back", async () => {
  const before = slack.botMessages(DM).length;
  const attempts = slack.socketDeliveries.length;
  await stack.kill("gateway", "SIGKILL");
  const sent = slack.sendSocketEvent(dm("while it was down"));
  await waitFor("the first attempt to time out", async () => slack.socketDeliveries.length > attempts);
  assert.equal(slack.socketDeliveries[attempts]!.acked, false, "not acknowledged: nothing took it");
  await stack.start("gateway");
  assert.equal(await sent, true, "acknowledged once delivered");
  await answered(before + 1, /^You said: while it was down/);
  await quiet();
  assert.equal(slack.botMessages(DM).length, before + 1, "answered once");
});

test("each connection is replaced after the refresh interval, so one gone silent is left behind", async () => {
  await adapter!.kill("SIGTERM");
  adapter = await startAdapter("slack", env({ TROUPE_SLACK_SOCKET_REFRESH_MS: "2000" }), /by Socket Mode/);
  const before = slack.botMessages(DM).length;
  const opened = slack.connectionsOpened;
  // Nothing passes on it any more, and nothing closes it: only the refresh gets past it.
  slack.liveSocket()!.silence();
  assert.equal(await slack.sendSocketEvent(dm("through the silence")), true);
  await answered(before + 1, /^You said: through the silence/);
  assert.ok(slack.connectionsOpened > opened, "a new connection was opened");
  assert.ok(slack.socketDeliveries.at(-1)!.retry > 0, "the silent connection acknowledged nothing");
  // Connections it replaced are closed by the adapter, not left to pile up.
  await new Promise((r) => setTimeout(r, 6000));
  const open = slack.sockets.filter((x) => !x.closed && x.closeCode === undefined).length;
  assert.ok(open <= 3, `${open} connections still open`);
  // A stop does not wait for ever on a connection that will never answer its close.
  const stopped = adapter!;
  adapter = undefined;
  const exit = await Promise.race([
    stopped.kill("SIGTERM"),
    new Promise((r) => setTimeout(() => r("still running 10 s after SIGTERM"), 10_000)),
  ]);
  if (exit !== 0) await stopped.kill("SIGKILL");
  assert.equal(exit, 0);
});

test("a button's click comes as an interactive envelope, is acknowledged, and decides the held call", async () => {
  adapter = await startAdapter("slack", env(), /by Socket Mode/);
  const ts = slack.nextTs();
  const asking = '!call manage_schedule {"action": "list"}';
  const event = { type: "message", channel: APPROVALS_DM, channel_type: "im", user: "U0ALICE01", text: asking, ts };
  assert.equal(await slack.sendSocketEvent(event), true);
  const question = await waitFor("the question with its buttons", async () =>
    slack.botMessages(APPROVALS_DM).find((m) => m.blocks?.some((b) => b.type === "actions")),
  );
  const by = { user: "U0ALICE01", channel: APPROVALS_DM, message: question, actionId: "troupe_reject" };
  assert.equal(await slack.clickBySocket(by), true, "acknowledged");
  await waitFor("the run's reply", async () =>
    slack
      .botMessages(APPROVALS_DM)
      .some((m) => /Tool results: Not run: slack:U0ALICE01 rejected/.test(m.versions.at(-1)!)),
  );
  assert.match(question.versions.at(-1)!, /Rejected by <@U0ALICE01>\.$/);
});

test("tokens Slack refuses stop the adapter with the reason", async () => {
  const other = path.join(dataDir, "other.json");
  await assert.rejects(
    startAdapter("slack", env({ SLACK_APP_TOKEN: "xapp-1-wrong", TROUPE_ADAPTER_STATE: other }), /taking events/),
    /refused SLACK_APP_TOKEN \(invalid_auth\)/,
  );
  await assert.rejects(
    startAdapter("slack", env({ SLACK_APP_TOKEN: TOKEN, TROUPE_ADAPTER_STATE: other }), /taking events/),
    /SLACK_APP_TOKEN.*must be an app-level token \(xapp-\.\.\.\)/,
  );
});
