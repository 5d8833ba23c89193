// `troupe adapter telegram` against a Bot API server written from Telegram's reference
// (helpers/telegram-api.ts): a chat message reaches the agent and its reply streams back as one
// message edited at a bounded rate; long replies are split at Telegram's limit; groups answer only
// what is addressed to the bot, in the topic it came from; directives act for allowed users only;
// an adapter killed mid-reply and started again neither loses nor doubles a message. Strangers
// writing in private under the defaults (pairing, per-channel-peer) get a code and reach nothing
// until the operator lets them in, and then each has a conversation of their own.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { startAdapter, type AdapterProcess } from "./helpers/adapter.js";
import { execFile } from "node:child_process";
import { freePort, MAIN, startStack, waitFor, type Stack } from "./helpers/stack.js";
import { TelegramApiServer } from "./helpers/telegram-api.js";

const TOKEN = "123456:ABC-test-token";
const ALICE = { id: 1001, first_name: "Alice" };
const BOB = { id: 1002, first_name: "Bob" };
const CAROL = { id: 1003, first_name: "Carol" };
const HANK = { id: 1004, first_name: "Hank" };
const DAVE = { id: 2001, first_name: "Dave" };
const ERIN = { id: 2002, first_name: "Erin" };
const FRANK = { id: 3001, first_name: "Frank" };
const GINA = { id: 3002, first_name: "Gina" };
let stack: Stack;
let dataDir: string;
let telegram: TelegramApiServer;
let apiUrl: string;
let adapterKey: string;
let adapter: AdapterProcess | undefined;

const start = async () => {
  adapter = await startAdapter(
    "telegram",
    {
      TROUPE_API_KEY: adapterKey,
      TROUPE_GATEWAY_ADDR: stack.addr.gateway,
      TROUPE_DATA_DIR: dataDir,
      TELEGRAM_BOT_TOKEN: TOKEN,
      TELEGRAM_API_URL: apiUrl,
      TROUPE_ADAPTER_COMMAND_USERS: String(ALICE.id),
      // Known people, let in by name; strangers meet the default DM policy, pairing.
      TROUPE_ADAPTER_ALLOW_FROM: [BOB.id, CAROL.id, HANK.id].join(","),
    },
    /telegram adapter polling as @troupe_bot/,
  );
};

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-telegram-"));
  // An operator who chose one shared session for the DMs of another bot (channel "shared").
  await writeFile(
    path.join(dataDir, "routing.json"),
    JSON.stringify({ bindings: [{ agent: "main", match: { channel: "shared" }, dmScope: "main" }] }),
  );
  await mkdir(path.join(dataDir, "agents", "main"), { recursive: true });
  // Listing schedules waits for a person's approval (creating one does not: a test below does).
  await writeFile(
    path.join(dataDir, "agents", "main", "agent.json"),
    JSON.stringify({
      models: ["scripted-2"],
      approvals: { tools: { manage_schedule: { mode: "ask", allowArguments: { action: ["create", "delete"] } } } },
    }),
  );
  stack = await startStack({
    dataDir,
    services: ["model-server", "router", "memory", "runner", "gateway"],
    env: { TROUPE_MIN_HEARTBEAT_S: "1" },
  });
  adapterKey = await stack.keyFor("local", "tg-bot", { role: "adapter", channels: ["telegram"] });
  telegram = new TelegramApiServer(TOKEN);
  apiUrl = await telegram.start();
  for (const id of [ALICE.id, BOB.id, HANK.id, DAVE.id, ERIN.id]) telegram.addChat({ id, type: "private" });
  telegram.addChat({ id: -100500, type: "supergroup", title: "Team", is_forum: true });
  await start();
});
after(async () => {
  await adapter?.kill("SIGTERM");
  await telegram?.stop();
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

/** The bot's messages in a chat once `n` of them exist and the newest reads `last` (a regexp). */
const botSays = (chat: number, n: number, last: RegExp, ms = 30_000) =>
  waitFor(
    `${n} bot messages in ${chat}, the last matching ${last}`,
    async () => {
      const msgs = telegram.botMessages(chat);
      return msgs.length === n && last.test(msgs.at(-1)!.text) && msgs;
    },
    ms,
  );
const tokens = (n: number) => Array.from({ length: n }, (_, i) => `t${i + 1}`).join(" ");

test("a private message is answered in the chat, streamed as edits of one message at a bounded rate", async () => {
  const asked = telegram.userSays(ALICE.id, ALICE, "!tokens 40 rate=10");
  const [reply] = await botSays(ALICE.id, 1, new RegExp(`^${tokens(40)}\\s*$`));
  assert.ok(reply!.versions.length >= 3, `streamed as edits: ${reply!.versions.length} versions`);
  assert.ok(reply!.versions.length <= 8, `at most about one edit a second over 4 s: ${reply!.versions.length}`);
  assert.equal(reply!.reply_to, asked, "a reply to the message it answers");
  for (const [i, v] of reply!.versions.entries())
    if (i > 0) assert.ok(v.startsWith(reply!.versions[i - 1]!.trim()), "each edit extends the last");
  assert.deepEqual(
    telegram.refusals.filter((r) => !r.includes("Too Many Requests")),
    [],
    "nothing Telegram would refuse, apart from flood control the adapter waits out",
  );
});

test("a tool call held for approval is asked with buttons; only the chat's person decides; a press runs it once", async () => {
  const before = telegram.botMessages(HANK.id).length;
  telegram.userSays(HANK.id, HANK, '!call manage_schedule {"action": "list"}');
  const question = await waitFor("the question with its buttons", async () =>
    telegram
      .botMessages(HANK.id)
      .slice(before)
      .find((m) => m.reply_markup),
  );
  assert.match(question.text, /manage_schedule[\s\S]*"action": ?"list"/);
  const [approve, reject] = question.reply_markup!.inline_keyboard[0]!;
  assert.deepEqual([approve!.text, reject!.text], ["Approve", "Reject"]);
  // Someone who is not this chat's person (nor an operator): refused with an alert, nothing decided.
  const foreign = telegram.press(HANK.id, question.message_id, DAVE, approve!.callback_data);
  const refused = await waitFor("the foreign press answered", async () => telegram.queries.get(foreign));
  assert.equal(refused.show_alert, true);
  assert.match(refused.text ?? "", /Only the person this chat is with/);
  assert.ok(question.reply_markup, "the buttons are still there");
  // Hank approves: the press is answered, the question says so and loses its buttons, the tool runs.
  const pressed = telegram.press(HANK.id, question.message_id, HANK, approve!.callback_data);
  const answered = await waitFor("the press answered", async () => telegram.queries.get(pressed));
  assert.match(answered.text ?? "", /Approved by Hank/);
  await waitFor("the run's reply", async () =>
    telegram
      .botMessages(HANK.id)
      .slice(before)
      .some((m) => /Tool results: \(no schedules\)/.test(m.text)),
  );
  assert.equal(question.reply_markup, undefined, "a decided question has no buttons");
  assert.match(question.text, /Approved by Hank\.$/);
  // A second press on the old keyboard changes nothing.
  const again = telegram.press(HANK.id, question.message_id, HANK, reject!.callback_data);
  const late = await waitFor("the late press answered", async () => telegram.queries.get(again));
  assert.match(late.text ?? "", /no longer open/);
  assert.equal(
    telegram
      .botMessages(HANK.id)
      .slice(before)
      .filter((m) => /Tool results/.test(m.text)).length,
    1,
    "the call ran once",
  );
  assert.deepEqual(
    telegram.refusals.filter((r) => !r.includes("Too Many Requests")),
    [],
    "nothing Telegram would refuse",
  );
});

test("strangers writing in private get a pairing code and reach nothing; let in, each talks alone", async () => {
  // Under the defaults: no routing file (per-channel-peer), no DM policy set (pairing).
  telegram.userSays(DAVE.id, DAVE, "my locker code is 4412");
  telegram.userSays(ERIN.id, ERIN, "my locker code is 9001");
  const codeOf = async (who: typeof DAVE) => {
    const [told] = await botSays(who.id, 1, /Your pairing code is [A-Z2-9]{8}/);
    return /pairing code is ([A-Z2-9]{8})/.exec(told!.text)![1]!;
  };
  const [daveCode, erinCode] = [await codeOf(DAVE), await codeOf(ERIN)];
  assert.notEqual(daveCode, erinCode);
  // Writing again while waiting: the same code, not told twice.
  telegram.userSays(DAVE.id, DAVE, "hello?");
  const gw = await stack.gatewayAs("local", "tg-bot");
  try {
    const sessions = async () => (await gw.listSessions({})).sessions.map((s) => s.sessionId);
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(telegram.botMessages(DAVE.id).length, 1, "the code is told once");
    assert.ok(!(await sessions()).some((id) => id.endsWith(`:${DAVE.id}`) || id.endsWith(`:${ERIN.id}`)), "no session");
    const listed = await pairing("ls");
    assert.match(listed.stdout, new RegExp(`${daveCode}  ${DAVE.id} \\(Dave\\)`));
    assert.equal((await pairing("approve", "WRONGCOD")).code, 1);
    assert.match(
      (await pairing("approve", daveCode.toLowerCase())).stdout,
      /telegram: let in 2001 \(Dave\); they were told/,
    );
    assert.match((await pairing("approve", erinCode)).stdout, /let in 2002 \(Erin\)/);
    await botSays(DAVE.id, 2, /You are let in/);
    // What they wrote before is not in any session: each one's first message is the next.
    telegram.userSays(DAVE.id, DAVE, "!first");
    telegram.userSays(ERIN.id, ERIN, "!first");
    const [daveReply] = (await botSays(DAVE.id, 3, /./)).slice(-1);
    const [erinReply] = (await botSays(ERIN.id, 3, /./)).slice(-1);
    for (const reply of [daveReply!, erinReply!]) assert.doesNotMatch(reply.text, /locker|hello\?/);
    // Each in a session of their own, answered in their own chat, each reply to its own message.
    const own = (await sessions()).filter((id) => id.endsWith(`:${DAVE.id}`) || id.endsWith(`:${ERIN.id}`));
    assert.equal(own.length, 2, own.join(", "));
    telegram.userSays(DAVE.id, DAVE, "dave's own words");
    const asked = telegram.userSays(ERIN.id, ERIN, "erin's own words");
    const [toErin] = (await botSays(ERIN.id, 4, /You said: erin's own words/)).slice(-1);
    assert.equal(toErin!.reply_to, asked);
    await botSays(DAVE.id, 4, /You said: dave's own words/);
    for (const id of own) {
      const texts = (await gw.getHistory({ sessionId: id })).messages.map((m) => m.text).join("\n");
      const mine = id.endsWith(`:${DAVE.id}`) ? "dave" : "erin";
      assert.match(texts, new RegExp(`${mine}'s own words`));
      assert.doesNotMatch(texts, new RegExp(`${mine === "dave" ? "erin" : "dave"}'s own words`));
    }
    // Revoked, Dave is a stranger again.
    assert.match((await pairing("revoke", String(DAVE.id))).stdout, /may no longer write in private/);
    telegram.userSays(DAVE.id, DAVE, "still there?");
    await botSays(DAVE.id, 5, /Your pairing code is/);
  } finally {
    gw.close();
  }
});

test("a shared DM session (dmScope main, chosen): each reply in its own chat, a schedule's where it was made", async () => {
  const bot = new TelegramApiServer(TOKEN);
  const url = await bot.start();
  for (const id of [FRANK.id, GINA.id]) bot.addChat({ id, type: "private" });
  const key = await stack.keyFor("local", "tg-shared", { role: "adapter", channels: ["shared"] });
  const env = {
    TROUPE_API_KEY: key,
    TROUPE_GATEWAY_ADDR: stack.addr.gateway,
    TROUPE_DATA_DIR: dataDir,
    TROUPE_ADAPTER_STATE: path.join(dataDir, "shared-bot.json"),
    TELEGRAM_BOT_TOKEN: TOKEN,
    TELEGRAM_API_URL: url,
    TROUPE_ADAPTER_ALLOW_FROM: `${FRANK.id},${GINA.id}`,
  };
  const shared = await startAdapter("telegram", env, /polling as @troupe_bot/, ["--channel", "shared"]);
  const says = (chat: number, n: number, last: RegExp) =>
    waitFor(`${n} messages in ${chat}`, async () => {
      const m = bot.botMessages(chat);
      return m.length === n && last.test(m.at(-1)!.text) && m;
    });
  const gw = await stack.gatewayAs("local", "tg-shared");
  try {
    // Frank's run is going when Gina writes: hers is not steered into it, and is answered in her chat.
    bot.userSays(FRANK.id, FRANK, "!tokens 30 rate=10");
    await waitFor("Frank's reply started", async () => bot.botMessages(FRANK.id).length === 1);
    bot.userSays(GINA.id, GINA, "hello from gina");
    await says(FRANK.id, 1, /t30\s*$/);
    await says(GINA.id, 1, /^You said: hello from gina/);
    assert.equal(bot.botMessages(FRANK.id).length, 1);
    // Frank makes a schedule; Gina writes last; the schedule's turn is answered in Frank's chat.
    bot.userSays(
      FRANK.id,
      FRANK,
      '!call manage_schedule {"action": "create", "schedule_id": "ping", "every_seconds": 2, "text": "ping"}',
    );
    await says(FRANK.id, 2, /scheduled ping/);
    bot.userSays(GINA.id, GINA, "me again");
    await says(GINA.id, 2, /^You said: me again/);
    await says(FRANK.id, 3, /ping/);
    const [session] = (await gw.listSessions({})).sessions.map((s) => s.sessionId);
    assert.equal(session, "agent:main:main", "one shared session, as configured");
    await gw.deleteSchedule({ sessionId: session, scheduleId: "ping" });
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(bot.botMessages(GINA.id).length, 2, "none of the schedule's replies went to Gina");
  } finally {
    gw.close();
    await shared.kill("SIGTERM");
    await bot.stop();
  }
});

/** `troupe pairing ...` against the test's data directory. */
function pairing(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) =>
    execFile(process.execPath, [MAIN, "pairing", ...args, "--data-dir", dataDir], (err, stdout, stderr) =>
      resolve({ code: (err as { code?: number } | null)?.code ?? 0, stdout, stderr }),
    ),
  );
}

test("a reply over 4096 characters is split at a break into messages Telegram accepts", async () => {
  telegram.userSays(BOB.id, BOB, "!tokens 1500");
  const parts = await botSays(BOB.id, 2, /t1500\s*$/);
  assert.ok(parts.every((m) => m.text.length <= 4096 && m.text.length > 0));
  assert.equal(parts.map((m) => m.text.trim()).join(" "), tokens(1500));
});

test("in a group only what is addressed to the bot is answered, in the topic it came from", async () => {
  const group = -100500;
  telegram.userSays(group, BOB, "just chatting among ourselves", { thread: 7 });
  const asked = telegram.userSays(group, BOB, "@troupe_bot hello there", { thread: 7 });
  const [reply] = await botSays(group, 1, /You said: @troupe_bot hello there/);
  assert.equal(reply!.message_thread_id, 7);
  assert.equal(reply!.reply_to, asked);
  // A reply to the bot's own message is addressed to it too.
  telegram.userSays(group, ALICE, "and this?", { thread: 7, replyTo: reply!.message_id });
  await botSays(group, 2, /You said: and this\?/);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(telegram.botMessages(group).length, 2, "the message not addressed to the bot got no answer");
});

test("directives act for allowed users; from anyone else they are text", async () => {
  const before = telegram.botMessages(ALICE.id).length;
  telegram.userSays(ALICE.id, ALICE, "/status@troupe_bot");
  const msgs = await botSays(ALICE.id, before + 1, /^agent main, model /);
  assert.match(msgs.at(-1)!.text, /messages in context/);
  telegram.userSays(ALICE.id, ALICE, "/model scripted-2");
  await botSays(ALICE.id, before + 2, /^Model set to scripted-2\./);
  telegram.userSays(ALICE.id, ALICE, "/think high");
  await botSays(ALICE.id, before + 3, /^Reasoning effort set to high\./);
  telegram.userSays(ALICE.id, ALICE, "/status");
  await botSays(ALICE.id, before + 4, /model scripted-2, reasoning effort high/);
  telegram.userSays(ALICE.id, ALICE, "/new");
  await botSays(ALICE.id, before + 5, /^Started a new conversation/);
  telegram.userSays(ALICE.id, ALICE, "/status");
  await botSays(ALICE.id, before + 6, /0 of \d+ messages in context|0 messages in context/);
  const bobBefore = telegram.botMessages(BOB.id).length;
  telegram.userSays(BOB.id, BOB, "/new");
  await botSays(BOB.id, bobBefore + 1, /^You said: \/new/);
});

test("killed mid-reply and started again: the reply is finished in the same message, nothing lost or doubled", async () => {
  const before = telegram.botMessages(ALICE.id).length;
  telegram.userSays(ALICE.id, ALICE, "!tokens 60 rate=10");
  await waitFor("the draft is showing", async () => telegram.botMessages(ALICE.id).length === before + 1);
  await adapter!.kill("SIGKILL");
  // Written while no adapter runs: Telegram keeps it until the next getUpdates confirms it.
  telegram.userSays(ALICE.id, ALICE, "are you there?");
  await start();
  const msgs = await botSays(ALICE.id, before + 2, /You said: are you there\?/);
  const long = msgs[before]!;
  assert.equal(long.text.trim(), tokens(60), "the reply streamed before the kill is completed in place");
  assert.equal(msgs.slice(before).filter((m) => m.text.startsWith("t1 t2")).length, 1, "one message for the reply");
  await new Promise((r) => setTimeout(r, 2000));
  assert.equal(telegram.botMessages(ALICE.id).length, before + 2, "no message twice");
});

test("a photo is downloaded by the adapter and reaches the session as an image, its caption as the text", async () => {
  const jpeg = Buffer.concat([Buffer.from("ffd8ffe000104a46494600", "hex"), Buffer.alloc(2000, 7)]);
  const before = telegram.botMessages(BOB.id).length;
  telegram.userSays(BOB.id, BOB, "what is this?", { photo: jpeg });
  // The scripted model has no vision: it answers the text, which names the photo.
  const msgs = await botSays(BOB.id, before + 1, /^You said: what is this\?/);
  assert.match(msgs.at(-1)!.text, /\[image: photo\.jpg \(image\/jpeg/);
  const gw = await stack.gatewayAs("local", "tg-bot");
  try {
    const sessions = (await gw.listSessions({})).sessions.map((s) => s.sessionId);
    const session = sessions.find((id) => id.endsWith(`:${BOB.id}`))!;
    const user = (await gw.getHistory({ sessionId: session })).messages.filter((m) => m.images.length > 0);
    assert.equal(user.length, 1);
    assert.equal(user[0]!.images[0]!.mimeType, "image/jpeg");
    assert.equal(Number(user[0]!.images[0]!.sizeBytes), jpeg.length);
    assert.ok(!user[0]!.images[0]!.sourceUrl.includes(TOKEN), "the bot's token never leaves the adapter");
  } finally {
    gw.close();
  }
});

test("a token the Bot API refuses stops the adapter with the reason", async () => {
  await assert.rejects(
    startAdapter(
      "telegram",
      {
        TROUPE_API_KEY: adapterKey,
        TROUPE_GATEWAY_ADDR: stack.addr.gateway,
        TROUPE_DATA_DIR: dataDir,
        TROUPE_ADAPTER_STATE: path.join(dataDir, "other.json"),
        TELEGRAM_BOT_TOKEN: "999:wrong",
        TELEGRAM_API_URL: apiUrl,
      },
      /polling as/,
    ),
    /refused TELEGRAM_BOT_TOKEN \(401\)/,
  );
});

test("webhook mode: setWebhook with a secret; updates come by POST and are answered; forged ones are refused", async () => {
  const hooks = new TelegramApiServer(TOKEN);
  const url = await hooks.start();
  hooks.addChat({ id: CAROL.id, type: "private" });
  const listen = `127.0.0.1:${await freePort()}`;
  const publicUrl = "https://bot.example.com:8443/telegram";
  // Telegram reaches the public URL; a proxy in front of the adapter would pass it on to here.
  hooks.proxy.set(publicUrl, `http://${listen}/telegram`);
  const env = {
    TROUPE_API_KEY: adapterKey,
    TROUPE_GATEWAY_ADDR: stack.addr.gateway,
    TROUPE_DATA_DIR: dataDir,
    TROUPE_ADAPTER_STATE: path.join(dataDir, "webhook-bot.json"),
    TELEGRAM_BOT_TOKEN: TOKEN,
    TELEGRAM_API_URL: url,
    TELEGRAM_WEBHOOK_URL: publicUrl,
    TELEGRAM_WEBHOOK_SECRET: "s3cret_token-1",
    TROUPE_WEBHOOK_ADDR: listen,
    TROUPE_ADAPTER_ALLOW_FROM: String(CAROL.id),
  };
  const bot = await startAdapter("telegram", env, /telegram adapter taking its webhook as @troupe_bot/);
  try {
    hooks.userSays(CAROL.id, CAROL, "by webhook");
    const msgs = await waitFor("the answer", async () => {
      const m = hooks.botMessages(CAROL.id);
      return m.length === 1 && /^You said: by webhook/.test(m[0]!.text) && m;
    });
    assert.equal(msgs.length, 1);
    const forged = await fetch(`http://${listen}/telegram`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-telegram-bot-api-secret-token": "guess" },
      body: JSON.stringify({
        update_id: 99,
        message: { message_id: 9, date: 0, chat: { id: CAROL.id, type: "private" }, from: CAROL, text: "forged" },
      }),
    });
    assert.equal(forged.status, 401);
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(hooks.botMessages(CAROL.id).length, 1);
    assert.deepEqual(hooks.refusals, []);
  } finally {
    await bot.kill("SIGTERM");
    await hooks.stop();
  }
  // Telegram refuses a webhook that is not HTTPS: the adapter does not start.
  await assert.rejects(
    startAdapter(
      "telegram",
      { ...env, TELEGRAM_WEBHOOK_URL: "http://bot.example.com/telegram" },
      /taking its webhook as/,
    ),
    /must be an https:\/\/ URL/,
  );
});
