// `troupe adapter webhook` end to end: signed POSTs in, signed reply POSTs out. The receiver here
// checks signatures with its own code, written from docs/channels.md, not the adapter's; it fails
// on purpose to see retries honour Retry-After. Bad requests are refused with the right status and
// reach no agent; a message sent twice is answered once; a killed adapter loses and doubles nothing.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { startAdapter, type AdapterProcess } from "./helpers/adapter.js";
import { freePort, startStack, waitFor, type Stack } from "./helpers/stack.js";

const SECRET = "webhook-test-secret";
let stack: Stack;
let dataDir: string;
let adapterKey: string;
let adapter: AdapterProcess | undefined;
let inbound: string;
let receiver: http.Server;
let replyUrl: string;
/** Replies received with a good signature, in order (duplicates included). */
const replies: { delivery: string; body: Record<string, string> }[] = [];
let failNext = 0;
/** Chats whose replies are refused (503, Retry-After: 1) while listed. */
const failingChats = new Set<string>();
let attempts = 0;

const hmac = (ts: string, body: string) =>
  `v1=${createHmac("sha256", SECRET).update(`v1:${ts}:${body}`).digest("hex")}`;

const start = async () => {
  adapter = await startAdapter(
    "webhook",
    {
      TROUPE_API_KEY: adapterKey,
      TROUPE_GATEWAY_ADDR: stack.addr.gateway,
      TROUPE_DATA_DIR: dataDir,
      TROUPE_WEBHOOK_ADDR: inbound,
      TROUPE_WEBHOOK_SECRET: SECRET,
      TROUPE_WEBHOOK_REPLY_URL: replyUrl,
    },
    /webhook adapter taking POST \/messages/,
  );
};

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-webhook-"));
  // A session per chat, so that each test's messages start runs of their own.
  await writeFile(path.join(dataDir, "routing.json"), JSON.stringify({ session: { dmScope: "per-channel-peer" } }));
  stack = await startStack({ dataDir, services: ["model-server", "router", "memory", "runner", "gateway"] });
  adapterKey = await stack.keyFor("local", "hooks", { role: "adapter", channels: ["webhook"] });
  receiver = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      attempts++;
      const ts = String(req.headers["x-troupe-timestamp"]);
      if (req.headers["x-troupe-signature"] !== hmac(ts, body) || Math.abs(Date.now() / 1000 - Number(ts)) > 300) {
        res.writeHead(401).end();
        return;
      }
      if (failingChats.has(JSON.parse(body).chat_id)) {
        res.writeHead(503, { "retry-after": "1" }).end();
        return;
      }
      if (failNext > 0) {
        failNext--;
        res.writeHead(503, { "retry-after": "1" }).end();
        return;
      }
      replies.push({ delivery: String(req.headers["x-troupe-delivery"]), body: JSON.parse(body) });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", () => r()));
  replyUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/replies`;
  inbound = `127.0.0.1:${await freePort()}`;
  await start();
});
after(async () => {
  await adapter?.kill("SIGTERM");
  receiver?.close();
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

/** POSTs `doc` to the adapter, signed unless `headers` say otherwise. */
async function post(doc: unknown, headers: Record<string, string> = {}) {
  const body = typeof doc === "string" ? doc : JSON.stringify(doc);
  const ts = String(Math.floor(Date.now() / 1000));
  const res = await fetch(`http://${inbound}/messages`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "x-troupe-timestamp": ts,
      "x-troupe-signature": hmac(ts, body),
      ...headers,
    },
    body,
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}
/** A direct message from user `id`'s own chat (one session each). */
const message = (id: string, text: string, extra: object = {}) => ({
  id,
  chat: { id: `chat-${id}` },
  sender: { id: `user-${id}`, name: "Una" },
  text,
  ...extra,
});
const repliesTo = (id: string) => replies.filter((r) => r.body.in_reply_to === id);

test("a signed message reaches the agent and its reply is POSTed, signed, to the reply URL", async () => {
  const res = await post(message("m1", "hi there"));
  assert.equal(res.status, 200);
  assert.equal(res.body.duplicate, false);
  assert.match(String(res.body.session_id), /webhook:dm:user-m1$/);
  await waitFor("the reply", async () => repliesTo("m1").length === 1);
  const [r] = repliesTo("m1");
  assert.equal(r!.body.text, "You said: hi there");
  assert.equal(r!.body.chat_id, "chat-m1");
  assert.equal(r!.delivery, r!.body.id);
});

test("the same message id twice is one message, answered once", async () => {
  const first = await post(message("m2", "only once"));
  const again = await post(message("m2", "only once"));
  assert.equal(again.status, 200);
  assert.equal(again.body.duplicate, true);
  assert.equal(again.body.session_id, first.body.session_id);
  await waitFor("the reply", async () => repliesTo("m2").length === 1);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(repliesTo("m2").length, 1);
});

test("bad requests are refused with the right status and reach no agent", async () => {
  const good = JSON.stringify(message("bad-1", "must not arrive"));
  const cases: [string, Promise<{ status: number; body: Record<string, unknown> }>, number, RegExp][] = [
    ["forged signature", post(good, { "x-troupe-signature": "v1=00" }), 401, /does not match/],
    ["old timestamp", post(good, { "x-troupe-timestamp": "1000000000" }), 401, /more than 300 s/],
    ["no signature", post(good, { "x-troupe-signature": "" }), 401, /does not match|missing/],
    ["not JSON", post("{nope"), 400, /not JSON/],
    ["no chat", post({ id: "bad-2", sender: { id: "u1" }, text: "x" }), 400, /chat is required/],
    ["unknown field", post({ ...message("bad-3", "x"), extra: 1 }), 400, /extra/],
    ["no text or media", post(message("bad-4", "")), 400, /neither text nor media/],
  ];
  for (const [what, call, status, why] of cases) {
    const res = await call;
    assert.equal(res.status, status, what);
    assert.match(String(res.body.error), why, what);
  }
  const wrongType = await fetch(`http://${inbound}/messages`, {
    method: "POST",
    headers: { "content-type": "text/plain" },
    body: good,
  });
  assert.equal(wrongType.status, 415);
  assert.equal((await fetch(`http://${inbound}/messages`)).status, 405);
  assert.equal((await fetch(`http://${inbound}/elsewhere`, { method: "POST" })).status, 404);
  await new Promise((r) => setTimeout(r, 1000));
  assert.ok(!replies.some((r) => String(r.body.text).includes("must not arrive")));
  // The adapter still serves.
  assert.equal((await post(message("m3", "still here"))).status, 200);
  await waitFor("the reply after the refusals", async () => repliesTo("m3").length === 1);
});

test("a directive is answered in the response; without command rights it is text", async () => {
  const res = await post(message("m4", "/status", { command_authorized: true }));
  assert.equal(res.status, 200);
  assert.match(String(res.body.reply), /^agent main, model /);
  const plain = await post(message("m5", "/status", { chat: { id: "chat-m4" }, sender: { id: "user-m4" } }));
  assert.equal(plain.body.reply, undefined);
  await waitFor("the plain reply", async () => repliesTo("m5").length === 1);
  assert.equal(repliesTo("m5")[0]!.body.text, "You said: /status");
});

test("a receiver that fails is retried after its Retry-After, and gets the reply once", async () => {
  failNext = 2;
  const before = attempts;
  const sent = Date.now();
  await post(message("m6", "retry me"));
  await waitFor("the reply after two failures", async () => repliesTo("m6").length === 1, 30_000);
  assert.ok(Date.now() - sent >= 2000, "two waits of Retry-After: 1");
  assert.ok(attempts - before >= 3);
});

test("killed mid-reply and started again: the reply arrives once", async () => {
  await post(message("m7", "!tokens 60 rate=10"));
  await new Promise((r) => setTimeout(r, 1500));
  await adapter!.kill("SIGKILL");
  await start();
  await waitFor("the long reply", async () => repliesTo("m7").length === 1, 30_000);
  await new Promise((r) => setTimeout(r, 2000));
  assert.equal(repliesTo("m7").length, 1);
  assert.equal(repliesTo("m7")[0]!.body.text.trim().split(" ").length, 60);
});

test("a chat whose replies keep failing holds up no other chat", async () => {
  failingChats.add("chat-m8");
  await post(message("m8", "stuck"));
  await post(message("m9", "not stuck"));
  await waitFor("the other chat's reply", async () => repliesTo("m9").length === 1, 15_000);
  assert.equal(repliesTo("m8").length, 0);
  failingChats.delete("chat-m8");
  await waitFor("the stuck reply, once it can go", async () => repliesTo("m8").length === 1, 15_000);
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(repliesTo("m8").length, 1);
});
