// Downloads that stop at their bound (services/shared/net/bounded-body.ts): a chat platform's file is
// read only as far as the adapter would keep it, whatever size the platform declared.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { downloadUpTo } from "../../services/shared/net/bounded-body.js";
import { SlackApi } from "../../services/adapter/slack-api.js";
import { BotApi, BotApiError } from "../../services/adapter/bot-api.js";
import { flood, type Flooded } from "../helpers/flood.js";

const MiB = 1024 * 1024;
let server: http.Server;
let base = "";
let floods: Promise<Flooded>[] = [];

before(async () => {
  server = http.createServer((req, res) => {
    if (req.url === "/small") return void res.writeHead(200).end("four");
    if (req.url === "/missing") return void res.writeHead(404).end("no such file");
    // A file, or a JSON answer, far larger than any bound here, sent as fast as it is read.
    if (req.url?.startsWith("/api/")) floods.push(flood(res, "application/json", '{"ok":true,"x":"', "z", 64 * MiB));
    else floods.push(flood(res, "application/octet-stream", "", "z", 64 * MiB));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => {
  server.closeAllConnections();
  server.close();
});

test("a file within its bound comes whole; a missing one comes empty", async () => {
  assert.equal(Buffer.from(await downloadUpTo(`${base}/small`, {}, 4)).toString(), "four");
  assert.equal((await downloadUpTo(`${base}/missing`, {}, MiB)).length, 0);
  await assert.rejects(downloadUpTo("http://127.0.0.1:1/x", {}, MiB));
});

test("a file past its bound comes empty, and no more of it is read than the bound", async () => {
  floods = [];
  assert.equal((await downloadUpTo(`${base}/big`, {}, MiB)).length, 0);
  // Slack's url_private download goes the same way.
  assert.equal((await new SlackApi(base, "xoxb-test").download(`${base}/big`, MiB)).length, 0);
  assert.equal(floods.length, 2);
  for (const { sent, cut } of await Promise.all(floods)) {
    assert.ok(cut, "the reader let the connection go");
    // The bound, plus what the sockets' buffers took on the way.
    assert.ok(sent < 16 * MiB, `${sent} bytes sent before it did`);
  }
});

test("a platform's API answer past its bound is refused after no more than the bound", async () => {
  floods = [];
  // Telegram's Bot API (16 MiB) and Slack's Web API (4 MiB).
  await assert.rejects(new BotApi(`${base}/api`, "123:abc").call("getMe"), BotApiError);
  await assert.rejects(new SlackApi(`${base}/api`, "xoxb-test").call("auth.test", {}), /not a Web API answer/);
  assert.equal(floods.length, 2);
  for (const { sent, cut } of await Promise.all(floods)) {
    assert.ok(cut, "the adapter let the connection go");
    assert.ok(sent < 32 * MiB, `${sent} bytes sent before it did`);
  }
});
