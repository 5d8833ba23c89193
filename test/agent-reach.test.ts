// The agent's reach, through the whole stack with the scripted model's `!call` rule: web_fetch of
// a test server the runner's policy treats as public (127.0.0.2, via TROUPE_NET_ALLOW) and a
// refusal of the metadata address; http_request with a secret the model never sees; and a
// reminder the agent schedules for itself with manage_schedule, which fires into the session; and
// background processes (process) read, written to, signalled, and killed with the session; and
// a sandboxed command reaching the agent's egress hosts through the sandbox's proxy.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";
import { of, replyOf } from "./helpers/turn-stack.js";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { instanceOf } from "../services/sandbox/container-spec.js";

const TOKEN = "reach-token-5d1e2f";
let server: Server;
let port = 0;
let seenAuthorization: string[] = [];
let stack: Stack;
let dataDir = "";

before(async () => {
  server = createServer((req, res) => {
    seenAuthorization.push(String(req.headers.authorization ?? ""));
    if (req.url === "/page")
      return void res
        .writeHead(200, { "content-type": "text/html" })
        .end("<html><body><h1>Reach page</h1><p>Fetched through the guard.</p><script>HIDDEN()</script></body></html>");
    res
      .writeHead(200, { "content-type": "application/json" })
      .end(JSON.stringify({ youSent: req.headers.authorization }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.2", r));
  port = (server.address() as AddressInfo).port;
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-reach-"));
  await mkdir(path.join(dataDir, "agents", "reach"), { recursive: true });
  await writeFile(
    path.join(dataDir, "agents", "reach", "agent.json"),
    JSON.stringify({
      http: { allowHosts: ["127.0.0.2"], secrets: { API_TOKEN: ["127.0.0.2"] } },
      egress: { allowHosts: ["127.0.0.2"] },
    }),
  );
  await writeFile(path.join(dataDir, "secrets.json"), JSON.stringify({ API_TOKEN: TOKEN }));
  stack = await startStack({
    dataDir,
    env: {
      TROUPE_SANDBOX_POOL: "0",
      TROUPE_QUOTA_PROCESSES_PER_SESSION: "2",
      TROUPE_NET_ALLOW: "127.0.0.2/32",
      TROUPE_NET_PORTS: `80,443,${port}`,
      TROUPE_MIN_HEARTBEAT_S: "1",
      TROUPE_MEMORY_LEARN: "0",
    },
  });
});

after(async () => {
  await stack?.stop();
  server.closeAllConnections();
  server.close();
  await rm(dataDir, { recursive: true, force: true });
});

async function open(): Promise<ChatSession> {
  const s = new ChatSession(stack.gateway);
  s.send({ case: "open", value: { sessionId: "", agentId: "reach", create: true } });
  await s.waitOpened();
  return s;
}

const toolEnd = async (s: ChatSession, call: string) => {
  const ends = of(await s.turn(`!call ${call}`, 30_000), "toolExecutionEnd");
  assert.equal(ends.length, 1, call);
  return ends[0];
};

describe("the agent's reach through the runner", () => {
  test("web_fetch returns an allowed page's text; a metadata address is refused", async () => {
    const s = await open();
    const page = await toolEnd(s, `web_fetch {"url": "http://127.0.0.2:${port}/page"}`);
    assert.equal(page.isError, false, page.result);
    assert.match(page.result, /Status: 200[\s\S]*Reach page[\s\S]*Fetched through the guard\./);
    assert.ok(!page.result.includes("HIDDEN"));
    const metadata = await toolEnd(s, 'web_fetch {"url": "http://169.254.169.254/latest/meta-data/"}');
    assert.equal(metadata.isError, true);
    assert.match(metadata.result, /^web_fetch refused: 169\.254\.169\.254: 169\.254\.169\.254 is not a public address/);
    const loopback = await toolEnd(s, `web_fetch {"url": "http://[::ffff:127.0.0.1]:${port}/page"}`);
    assert.match(loopback.result, /refused: .*not a public address/);
    s.close();
  });

  test("exec: a command reaches the agent's egress hosts through the sandbox's proxy, and only those", async () => {
    const s = await open();
    const fetched = await toolEnd(
      s,
      `exec {"command": "wget -q -O - http://127.0.0.2:${port}/page; wget -q -O - http://127.0.0.3:${port}/page || echo REFUSED"}`,
    );
    assert.match(fetched.result, /<h1>Reach page<\/h1>/, fetched.result);
    assert.match(fetched.result, /REFUSED/);
    await waitFor("the refusal in the sandbox service's log", async () =>
      /egress GET http:\/\/127\.0\.0\.3:\d+\/page: refused, 403: 127\.0\.0\.3 is not among/.test(stack.logs()),
    );
    // And its system prompt says so, not that the sandbox has no network.
    const prompt = replyOf(await s.turn("!system", 30_000));
    assert.match(
      prompt,
      /Network: commands in the sandbox reach only these hosts.* 127\.0\.0\.2\. Nothing else is reachable\./,
    );
    assert.match(prompt, /Workspace: \/workspace in a sandbox of this session's own/);
    assert.doesNotMatch(prompt, /without network/);
    s.close();
    // Its sandbox goes with it (the process test below counts what is left).
    await stack.gateway.deleteSession({ sessionId: s.opened!.sessionId });
  });

  test("http_request sends the named secret to its host; the model sees only its name", async () => {
    seenAuthorization = [];
    const s = await open();
    const r = await toolEnd(
      s,
      `http_request {"method": "GET", "url": "http://127.0.0.2:${port}/api", "headers": {"authorization": "Bearer {{secret:API_TOKEN}}"}}`,
    );
    assert.equal(r.isError, false, r.result);
    assert.deepEqual(seenAuthorization, [`Bearer ${TOKEN}`]);
    assert.match(r.result, /"youSent":"Bearer \[secret API_TOKEN\]"/);
    const history = await stack.gateway.getHistory({ sessionId: s.opened!.sessionId, pageSize: 100 });
    assert.ok(!JSON.stringify(history.messages.map((m) => m.text)).includes(TOKEN));
    s.close();
  });

  test("manage_schedule: the agent schedules itself a reminder, it fires into the session, and it deletes it", async () => {
    const s = await open();
    const sessionId = s.opened!.sessionId;
    const made = await toolEnd(
      s,
      'manage_schedule {"action": "create", "schedule_id": "remind", "every_seconds": 1, "text": "REMINDER-PING"}',
    );
    assert.equal(made.isError, false, made.result);
    assert.deepEqual(
      (await stack.gateway.listSchedules({ sessionId })).schedules.map((x) => [x.scheduleId, x.text]),
      [["remind", "REMINDER-PING"]],
    );
    const fired = await s.waitFor(
      (e) =>
        e.payload.case === "messageEnd" &&
        e.payload.value.message?.role === Role.USER &&
        (e.payload.value.message?.text ?? "").startsWith("[Heartbeat remind"),
      20_000,
    );
    const firedText = fired.payload.case === "messageEnd" ? (fired.payload.value.message?.text ?? "") : "";
    assert.match(
      firedText,
      /^\[Heartbeat remind \(every 1 s\)[^\n]*This turn was not started by the user\.\]\nREMINDER-PING$/,
    );
    await s.waitForPayload("agentEnd", 20_000, s.events.indexOf(fired));
    const cron = await toolEnd(
      s,
      'manage_schedule {"action": "create", "schedule_id": "weekly", "cron": "0 9 * * mon", "time_zone": "America/New_York", "text": "weekly report"}',
    );
    assert.match(cron.result, /weekly: cron "0 9 \* \* mon" America\/New_York; next \d{4}-\d\d-\d\dT1[34]:00:00\.000Z/);
    for (const id of ["remind", "weekly"])
      assert.equal(
        (await toolEnd(s, `manage_schedule {"action": "delete", "schedule_id": "${id}"}`)).result,
        `deleted ${id}`,
      );
    assert.deepEqual((await stack.gateway.listSchedules({ sessionId })).schedules, []);
    s.close();
  });

  test("process: a background command is read, written to, signalled, held to the quota, and killed with its session", async () => {
    const s = await open();
    const sessionId = s.opened!.sessionId;
    const started = await toolEnd(
      s,
      'process {"action": "start", "command": "echo ready; while read line; do echo got:$line; done; echo stdin-closed"}',
    );
    assert.equal(started.result, "started p1");
    assert.equal(
      (await toolEnd(s, 'process {"action": "write", "id": "p1", "data": "hello\\n"}')).result,
      "wrote 6 bytes to p1",
    );
    const waited = await toolEnd(s, 'process {"action": "wait", "id": "p1", "timeout_ms": 1500}');
    assert.match(waited.result, /^p1: running after \d+ s[\s\S]*still running after 1500 ms\]\nready\ngot:hello\n$/);
    // What was read is not read again.
    const again = (await toolEnd(s, 'process {"action": "read", "id": "p1"}')).result;
    assert.equal(again.split("\n").slice(1).join("\n"), "");
    await toolEnd(s, 'process {"action": "write", "id": "p1", "data": "bye\\n", "close": true}');
    const ended = await toolEnd(s, 'process {"action": "wait", "id": "p1", "timeout_ms": 10000}');
    assert.match(ended.result, /^p1: exited 0 after \d+ s[\s\S]*got:bye\nstdin-closed\n$/);

    // A signal reaches the command; the quota counts running processes only.
    assert.equal((await toolEnd(s, 'process {"action": "start", "command": "sleep 300"}')).result, "started p2");
    assert.equal(
      (await toolEnd(s, 'process {"action": "start", "command": "sleep 301 & sleep 302"}')).result,
      "started p3",
    );
    const over = await toolEnd(s, 'process {"action": "start", "command": "true"}');
    assert.deepEqual(
      [over.isError, /already runs 2 background processes \(quota processesPerSession\)/.test(over.result)],
      [true, true],
    );
    const termed = await toolEnd(s, 'process {"action": "signal", "id": "p2", "signal": "TERM"}');
    assert.match(termed.result, /sent TERM to p2\np2: killed \(exit 143\)/);
    const listed = await toolEnd(s, 'process {"action": "list"}');
    assert.match(listed.result, /p1: exited 0[\s\S]*p2: killed[\s\S]*p3: running/);
    for (const [call, why] of [
      ['process {"action": "read", "id": "p9"}', /no process p9 in this session/],
      [
        'process {"action": "signal", "id": "p3", "signal": "USR1"}',
        /\/signal: must be equal to one of the allowed values/,
      ],
      ['process {"action": "write", "id": "p2", "data": "x"}', /p2 has ended/],
      ['process {"action": "start"}', /start needs a `command`/],
    ] as const) {
      const r = await toolEnd(s, call);
      assert.equal(r.isError, true, call);
      assert.match(r.result, why, call);
    }
    // Another session of the same owner does not see these processes.
    const other = await open();
    assert.match(
      (await toolEnd(other, 'process {"action": "read", "id": "p3"}')).result,
      /no process p3 in this session/,
    );
    other.close();

    // Deleting the session removes its sandbox: p3 and the sleep it started go with it.
    s.close();
    await stack.gateway.deleteSession({ sessionId });
    // No other session of this stack made a sandbox (and the pool is off): none may be left.
    const { stdout } = await promisify(execFile)("docker", [
      "ps",
      "-aq",
      "--filter",
      `label=troupe.instance=${instanceOf(dataDir)}`,
    ]);
    assert.equal(stdout.trim(), "", "the session's sandbox, and every process in it, is gone");
  });
});
