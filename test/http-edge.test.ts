// The gateway's HTTP face (gateway/http/edge.ts), tested the way its clients speak: Connect's own client
// (@connectrpc/connect-node, over HTTP/1.1 and over HTTP/2 with prior knowledge), a gRPC-Web
// client, and plain fetch with JSON as curl would send it. A turn is driven over HTTP alone:
// CreateSession, SendMessage, Subscribe; statuses are the gRPC API's, as Connect codes.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http2 from "node:http2";
import net from "node:net";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { freePort, startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
let base = "";
const CONSOLE = "https://console.example";
const DEADLINE = { firstByte: 800, head: 1200, body: 1200, idle: 1500 };

before(async () => {
  stack = await startStack({
    env: {
      TROUPE_SANDBOX_POOL: "0",
      TROUPE_MEMORY_LEARN: "0",
      TROUPE_HTTP_CORS: CONSOLE,
      // Short deadlines, so that the tests of them are quick; the other tests live within them.
      TROUPE_HTTP_FIRST_BYTE_MS: String(DEADLINE.firstByte),
      TROUPE_HTTP_HEAD_MS: String(DEADLINE.head),
      TROUPE_HTTP_BODY_MS: String(DEADLINE.body),
      TROUPE_HTTP_IDLE_MS: String(DEADLINE.idle),
    },
  });
  base = `http://${stack.addr.http}`;
});
after(async () => {
  await stack?.stop();
});

const auth = () => ({ authorization: `Bearer ${stack.apiKey}` });

/** A unary call as curl makes it: JSON in, JSON out. */
async function post(method: string, body: unknown, headers: Record<string, string> = auth()) {
  const res = await fetch(`${base}/troupe.v1.GatewayService/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

/** A Connect server stream read by hand: enveloped JSON messages, then the end-of-stream message. */
async function subscribeRaw(sessionId: string, afterSeq: number, until: (event: Record<string, unknown>) => boolean) {
  const request = Buffer.from(JSON.stringify({ sessionId, afterSeq: String(afterSeq) }));
  const envelope = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), request]);
  envelope.writeUInt32BE(request.length, 1);
  const controller = new AbortController();
  const res = await fetch(`${base}/troupe.v1.GatewayService/Subscribe`, {
    method: "POST",
    headers: { "content-type": "application/connect+json", ...auth() },
    body: envelope,
    signal: controller.signal,
  });
  assert.equal(res.status, 200);
  const events: Record<string, unknown>[] = [];
  const reader = res.body!.getReader();
  let buf = Buffer.alloc(0);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return { events, end: undefined };
    buf = Buffer.concat([buf, value]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const flags = buf[0];
      const message = JSON.parse(buf.subarray(5, 5 + buf.readUInt32BE(1)).toString("utf8"));
      buf = buf.subarray(5 + buf.readUInt32BE(1));
      if (flags & 2) return { events, end: message };
      events.push(message.event);
      if (until(message.event)) {
        controller.abort();
        return { events, end: undefined };
      }
    }
  }
}

describe("the HTTP face of the gateway", () => {
  test("curl's way: JSON unary calls drive a turn; the stream is Connect's enveloped JSON", async () => {
    const created = await post("CreateSession", { agentId: "main" });
    assert.equal(created.status, 200, JSON.stringify(created.json));
    const sessionId = (created.json.session as { sessionId: string }).sessionId;
    assert.match(sessionId, /^[0-9a-f-]{36}$/);
    const sent = await post("SendMessage", { sessionId, frameId: "f1", text: "!tokens 5" });
    assert.equal(sent.status, 200, JSON.stringify(sent.json));
    const acceptedSeq = Number((sent.json.accepted as { seq: string }).seq);
    const { events } = await subscribeRaw(sessionId, acceptedSeq, (e) => "agentEnd" in e);
    const text = events.map((e) => (e.messageUpdate as { text?: string } | undefined)?.text ?? "").join("");
    assert.equal(text.trim(), "t1 t2 t3 t4 t5");
    assert.ok(events.every((e, i) => i === 0 || Number(e.seq) > Number(events[i - 1].seq)));
    const listed = await post("ListSessions", {});
    assert.ok((listed.json.sessions as { sessionId: string }[]).some((s) => s.sessionId === sessionId));
  });

  test("Connect's client over HTTP/1.1 and HTTP/2, and gRPC-Web, see the same API", async () => {
    const transports = {
      "connect, HTTP/1.1": createConnectTransport({ baseUrl: base, httpVersion: "1.1" }),
      "connect, HTTP/2": createConnectTransport({ baseUrl: base, httpVersion: "2" }),
      "connect, binary": createConnectTransport({ baseUrl: base, httpVersion: "1.1", useBinaryFormat: true }),
      "gRPC-Web": createGrpcWebTransport({ baseUrl: base, httpVersion: "1.1" }),
    };
    for (const [name, transport] of Object.entries(transports)) {
      const client: Client<typeof GatewayService> = createClient(GatewayService, transport);
      const { session } = await client.createSession({}, { headers: auth() });
      const sessionId = session!.sessionId;
      const sent = await client.sendMessage({ sessionId, frameId: "f1", text: "!tokens 3" }, { headers: auth() });
      let text = "";
      const controller = new AbortController();
      for await (const { event } of client.subscribe(
        { sessionId, afterSeq: sent.accepted!.seq },
        { headers: auth(), signal: controller.signal },
      )) {
        if (event?.payload.case === "messageUpdate" && event.payload.value.delta.case === "text")
          text += event.payload.value.delta.value;
        if (event?.payload.case === "agentEnd") break;
      }
      assert.equal(text.trim(), "t1 t2 t3", name);
      const history = await client.getHistory({ sessionId }, { headers: auth() });
      assert.deepEqual(
        history.messages.map((m) => m.text.trim()),
        ["!tokens 3", "t1 t2 t3"],
        name,
      );
    }
  });

  test("SubscribeInbox streams over HTTP too, and its cursor resumes there", async () => {
    const client = createClient(GatewayService, createConnectTransport({ baseUrl: base, httpVersion: "1.1" }));
    const { session } = await client.createSession({}, { headers: auth() });
    const sessionId = session!.sessionId;
    await client.sendMessage({ sessionId, frameId: "i1", text: "first" }, { headers: auth() });
    /** Reads the inbox until this session's run ends; returns its events' seqs and the last cursor. */
    const read = async (afterCursor: string) => {
      const seqs: number[] = [];
      let cursor = "";
      const controller = new AbortController();
      for await (const res of client.subscribeInbox({ afterCursor }, { headers: auth(), signal: controller.signal })) {
        if (res.event?.sessionId !== sessionId) continue;
        seqs.push(Number(res.event.seq));
        cursor = res.cursor;
        if (res.event.payload.case === "agentEnd") break;
      }
      controller.abort();
      return { seqs, cursor };
    };
    const first = await read("");
    assert.ok(first.seqs.length > 3 && first.cursor.startsWith("i1."));
    await client.sendMessage({ sessionId, frameId: "i2", text: "second" }, { headers: auth() });
    const second = await read(first.cursor);
    assert.equal(second.seqs[0], first.seqs.at(-1)! + 1, "resumes right after the cursor's event");
  });

  test("failures carry the gRPC status as Connect's code, with its message", async () => {
    const cases: [string, unknown, Record<string, string>, number, string, RegExp][] = [
      ["ListSessions", {}, {}, 401, "unauthenticated", /missing credentials/],
      ["ListSessions", {}, { authorization: "Bearer not-a-key" }, 401, "unauthenticated", /API key/],
      ["GetHistory", { sessionId: "b3b1c0de-0000-4000-8000-000000000000" }, auth(), 404, "not_found", /session/],
      ["GetHistory", { sessionId: "../etc/passwd" }, auth(), 400, "invalid_argument", /session_id/],
      ["SendMessage", "{not json", auth(), 400, "invalid_argument", /./],
      ["SendMessage", { sessionId: 7, text: [] }, auth(), 400, "invalid_argument", /./],
    ];
    for (const [method, body, headers, status, code, message] of cases) {
      const r = await post(method, body, headers);
      const what = `${method} ${JSON.stringify(body)}: ${JSON.stringify(r.json)}`;
      assert.equal(r.status, status, what);
      assert.equal(r.json.code, code, what);
      assert.match(String(r.json.message), message, what);
    }
    // The bidirectional Chat stays on gRPC.
    const client = createClient(GatewayService, createConnectTransport({ baseUrl: base, httpVersion: "2" }));
    await assert.rejects(
      async () => {
        for await (const _ of client.chat((async function* () {})(), { headers: auth() })) break;
      },
      (e: unknown) => e instanceof ConnectError && e.code === Code.Unimplemented,
    );
    // A message over the gRPC limit is refused here too, and the server goes on serving.
    const big = await post("SendMessage", { sessionId: "x", text: "y".repeat(5 * 1024 * 1024) });
    assert.equal(big.json.code, "resource_exhausted", JSON.stringify(big.json).slice(0, 300));
    assert.equal((await post("ListSessions", {})).status, 200);
    const health = await fetch(`${base}/healthz`);
    assert.equal(await health.text(), "ok\n");
    // A route nobody serves: a keyless caller learns nothing of it, a keyed one that it is not there.
    assert.equal((await fetch(`${base}/nowhere`)).status, 401);
    assert.equal((await fetch(`${base}/nowhere`, { headers: auth() })).status, 404);
  });

  test("without a valid key a call is refused before its body is read, in each protocol, as on gRPC", async () => {
    const bad = { authorization: "Bearer not-a-key" };
    // Malformed bodies: before stop 62 the edge decoded first and answered invalid_argument.
    for (const [body, headers, message] of [
      ["{not json", bad, /unknown API key/],
      ['{"sessionId": 7}', {}, /missing credentials/],
    ] as const) {
      const r = await post("SendMessage", body, headers);
      assert.deepEqual([r.status, r.json.code], [401, "unauthenticated"], JSON.stringify(r.json));
      assert.match(String(r.json.message), message);
    }
    // A Connect stream with a torn envelope: one end-of-stream message (flags 2) naming the code.
    const stream = await fetch(`${base}/troupe.v1.GatewayService/Subscribe`, {
      method: "POST",
      headers: { "content-type": "application/connect+json", ...bad },
      body: Buffer.from([0, 0, 0, 0, 99, 123]),
    });
    const frame = Buffer.from(await stream.arrayBuffer());
    assert.equal(stream.status, 200);
    assert.equal(frame[0], 2);
    assert.deepEqual(JSON.parse(frame.subarray(5, 5 + frame.readUInt32BE(1)).toString("utf8")), {
      error: { code: "unauthenticated", message: "unknown API key" },
    });
    // gRPC-Web with garbage for a message: trailers-only, grpc-status 16.
    const web = await fetch(`${base}/troupe.v1.GatewayService/ListSessions`, {
      method: "POST",
      headers: { "content-type": "application/grpc-web+proto", ...bad },
      body: Buffer.from([0, 0, 0, 0, 9, 255, 255]),
    });
    assert.deepEqual([web.status, web.headers.get("grpc-status")], [200, "16"]);
    assert.equal(decodeURIComponent(web.headers.get("grpc-message") ?? ""), "unknown API key");
    // And each official client reads these refusals as Unauthenticated, unary and streaming.
    const transports = {
      connect: createConnectTransport({ baseUrl: base, httpVersion: "1.1" }),
      "connect, binary, HTTP/2": createConnectTransport({ baseUrl: base, httpVersion: "2", useBinaryFormat: true }),
      "gRPC-Web": createGrpcWebTransport({ baseUrl: base, httpVersion: "1.1" }),
    };
    const unauthenticated = (name: string) => (e: unknown) => {
      assert.ok(e instanceof ConnectError && e.code === Code.Unauthenticated, `${name}: ${String(e)}`);
      assert.match(e.rawMessage, /unknown API key/, name);
      return true;
    };
    for (const [name, transport] of Object.entries(transports)) {
      const client = createClient(GatewayService, transport);
      await assert.rejects(client.listSessions({}, { headers: bad }), unauthenticated(name));
      await assert.rejects(async () => {
        for await (const _ of client.subscribe({ sessionId: "s" }, { headers: bad })) break;
      }, unauthenticated(name));
    }
    // The edge serves on, and a good key is unaffected.
    assert.equal((await post("ListSessions", {})).status, 200);
  });

  test("a request target that is not a URL gets 400 over HTTP/1.1 and HTTP/2; the gateway stays up", async () => {
    const gateway = stack.process("gateway")!;
    const [host, port] = [stack.addr.http.split(":")[0], Number(stack.addr.http.split(":")[1])];
    /** One raw HTTP/1.1 request, as any client on the network may send it; the status line back. */
    const raw = (target: string) =>
      new Promise<string>((resolve, reject) => {
        const socket = net.connect(port, host, () => socket.write(`GET ${target} HTTP/1.1\r\nHost: x\r\n\r\n`));
        let got = "";
        socket.on("data", (d) => {
          got += d.toString("latin1");
          if (got.includes("\r\n")) socket.destroy(), resolve(got.split("\r\n")[0]);
        });
        socket.on("error", reject);
        socket.on("close", () => resolve(got.split("\r\n")[0]));
      });
    for (const target of ["http://[", "//[", "http://troupe:99999/v1/models"])
      assert.equal(await raw(target), "HTTP/1.1 400 Bad Request", target);
    // A model id whose escapes do not decode names no model: 404, as for any other unknown one.
    const models = await fetch(`${base}/v1/models/%E0%A4%A`, { headers: auth() });
    assert.equal(models.status, 404);
    assert.equal(((await models.json()) as { error: { code: string } }).error.code, "model_not_found");

    const h2 = http2.connect(base);
    try {
      const status = await new Promise<number>((resolve, reject) => {
        // nghttp2 refuses a :path not starting with "/" itself; this one starts with "/".
        const req = h2.request({ ":method": "GET", ":path": "//[" });
        req.on("response", (headers) => resolve(Number(headers[":status"])));
        req.on("error", reject);
        req.end();
      });
      assert.equal(status, 400);
    } finally {
      h2.close();
    }
    assert.equal(gateway.exitCode, null, "the gateway process is still running");
    assert.equal(stack.process("gateway"), gateway, "and was not restarted");
    assert.equal((await post("ListSessions", {})).status, 200);
  });

  test("CORS: the configured origin may call from a browser; others get no grant", async () => {
    const preflight = (origin: string) =>
      fetch(`${base}/troupe.v1.GatewayService/ListSessions`, {
        method: "OPTIONS",
        headers: {
          origin,
          "access-control-request-method": "POST",
          "access-control-request-headers": "authorization, content-type",
        },
      });
    const ok = await preflight(CONSOLE);
    assert.equal(ok.status, 204);
    assert.equal(ok.headers.get("access-control-allow-origin"), CONSOLE);
    assert.match(ok.headers.get("access-control-allow-headers") ?? "", /authorization/);
    const refused = await preflight("https://evil.example");
    assert.equal(refused.status, 403);
    assert.equal(refused.headers.get("access-control-allow-origin"), null);
    const call = await fetch(`${base}/troupe.v1.GatewayService/ListSessions`, {
      method: "POST",
      headers: { "content-type": "application/json", origin: CONSOLE, ...auth() },
      body: "{}",
    });
    assert.equal(call.headers.get("access-control-allow-origin"), CONSOLE);
  });
});

/** A raw connection to the edge's HTTP port, as anyone on the network may open one. */
function rawSocket(): Promise<net.Socket> {
  const [host, port] = [stack.addr.http.split(":")[0], Number(stack.addr.http.split(":")[1])];
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, host, () => resolve(socket));
    socket.on("error", reject);
  });
}

/** Everything the server sent until it closed the connection, and how long after `since` it closed. */
function untilClosed(socket: net.Socket, since = performance.now()): Promise<{ got: string; afterMs: number }> {
  let got = "";
  socket.on("data", (d) => (got += d.toString("latin1")));
  socket.on("error", () => undefined);
  return new Promise((resolve) => socket.on("close", () => resolve({ got, afterMs: performance.now() - since })));
}

describe("connections cannot be held open", () => {
  test("a silent connection is closed at the first-byte deadline; half a head at the head deadline", async () => {
    const silent = await rawSocket();
    const closed = await untilClosed(silent);
    assert.equal(closed.got, "");
    assert.ok(
      closed.afterMs >= DEADLINE.firstByte - 50 && closed.afterMs < DEADLINE.firstByte + 1000,
      `${closed.afterMs}`,
    );

    // A head sent a header at a time, each well within any inactivity timer: the head's own
    // deadline closes it all the same, keyless and unanswered.
    const slow = await rawSocket();
    const start = performance.now();
    const done = untilClosed(slow, start);
    slow.write("POST /v1/chat/completions HTTP/1.1\r\nHost: troupe\r\n");
    const drip = setInterval(() => slow.writable && slow.write(`x-drip-${Math.random()}: 1\r\n`), 200);
    const held = await done;
    clearInterval(drip);
    assert.ok(held.afterMs < DEADLINE.head + 1000, `the half head held the connection ${held.afterMs} ms`);
    assert.equal(held.got, "");
  });

  test("HTTP/2: a session that opens no stream is closed, and one idle after its streams", async () => {
    const session = http2.connect(base);
    const start = performance.now();
    const closed = await new Promise<number>((resolve) => {
      session.on("error", () => undefined);
      session.on("close", () => resolve(performance.now() - start));
    });
    assert.ok(closed < DEADLINE.head + 1000, `a streamless session lived ${closed} ms`);

    const used = http2.connect(base);
    used.on("error", () => undefined);
    const status = await new Promise<number>((resolve, reject) => {
      const req = used.request({ ":method": "GET", ":path": "/healthz" });
      req.on("response", (h) => resolve(Number(h[":status"])));
      req.on("error", reject);
      req.resume();
      req.end();
    });
    assert.equal(status, 200);
    const idleFrom = performance.now();
    const idled = await new Promise<number>((resolve) => used.on("close", () => resolve(performance.now() - idleFrom)));
    assert.ok(idled >= DEADLINE.idle - 100 && idled < DEADLINE.idle + 1000, `closed ${idled} ms after going idle`);
  });

  test("a body that does not come in time is answered 408, over HTTP/1.1 and HTTP/2", async () => {
    const socket = await rawSocket();
    const done = untilClosed(socket);
    const head = `POST /troupe.v1.GatewayService/ListSessions HTTP/1.1\r\nHost: troupe\r\nContent-Type: application/json\r\nAuthorization: Bearer ${stack.apiKey}\r\nContent-Length: 100\r\n\r\n{`;
    socket.write(head);
    const { got, afterMs } = await done;
    assert.match(got, /^HTTP\/1\.1 408 /);
    assert.ok(afterMs >= DEADLINE.body - 50 && afterMs < DEADLINE.body + 1000, `${afterMs}`);

    const h2 = http2.connect(base);
    h2.on("error", () => undefined);
    try {
      const start = performance.now();
      const [status, after] = await new Promise<[number, number]>((resolve, reject) => {
        const req = h2.request({
          ":method": "POST",
          ":path": "/troupe.v1.GatewayService/ListSessions",
          "content-type": "application/json",
          authorization: `Bearer ${stack.apiKey}`,
        });
        req.on("response", (h) => resolve([Number(h[":status"]), performance.now() - start]));
        req.on("error", reject);
        req.write("{");
      });
      assert.equal(status, 408);
      assert.ok(after < DEADLINE.body + 1000, `${after}`);
    } finally {
      h2.close();
    }
  });

  test("a streamed answer outlives every deadline: Subscribe and a /v1 stream", async () => {
    const created = await post("CreateSession", { agentId: "main" });
    const sessionId = (created.json.session as { sessionId: string }).sessionId;
    const sent = await post("SendMessage", { sessionId, frameId: "long", text: "!tokens 30 rate=10" });
    const seq = Number((sent.json.accepted as { seq: string }).seq);
    const start = performance.now();
    const { events } = await subscribeRaw(sessionId, seq, (e) => "agentEnd" in e);
    assert.ok(performance.now() - start > DEADLINE.idle + DEADLINE.body, "the stream lasted past the deadlines");
    assert.equal(events.filter((e) => "messageUpdate" in e).length >= 30, true);

    const v1 = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...auth() },
      body: JSON.stringify({
        model: "troupe/main",
        stream: true,
        messages: [{ role: "user", content: "!tokens 30 rate=10" }],
      }),
    });
    assert.equal(v1.status, 200);
    const text = await v1.text();
    assert.match(text, /data: \[DONE\]/);
    assert.equal((text.match(/"content":"[^"]/g) ?? []).length >= 30, true);
  });

  test("the key before the body: a keyless 3 MB /v1 request is answered 401 with its body unsent", async () => {
    const big = 3 * 1024 * 1024;
    // The head alone, the body held back: the answer comes without it.
    const plain = await rawSocket();
    const answered = new Promise<string>((resolve) => {
      let got = "";
      plain.on("data", (d) => {
        got += d.toString("latin1");
        if (got.includes("\r\n\r\n") && got.includes("}")) resolve(got);
      });
    });
    plain.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: troupe\r\nContent-Type: application/json\r\nContent-Length: ${big}\r\n\r\n`,
    );
    const reply = await answered;
    assert.match(reply, /^HTTP\/1\.1 401 /);
    assert.match(reply, /"code":"invalid_api_key"/);
    plain.destroy();

    // Expect: 100-continue, as curl sends a large body: no 100 Continue, the refusal, the close.
    const expecting = await rawSocket();
    const closed = untilClosed(expecting);
    expecting.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: troupe\r\nAuthorization: Bearer not-a-key\r\nContent-Type: application/json\r\nContent-Length: ${big}\r\nExpect: 100-continue\r\n\r\n`,
    );
    const { got } = await closed;
    assert.doesNotMatch(got, /100 Continue/);
    assert.match(got, /^HTTP\/1\.1 401 /);
    assert.match(got, /unknown API key/);

    // With a good key the client is told to go on.
    const good = await rawSocket();
    const continued = new Promise<string>((resolve) => {
      let seen = "";
      good.on("data", (d) => ((seen += d.toString("latin1")), seen.includes("\r\n\r\n") && resolve(seen)));
    });
    good.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: troupe\r\nAuthorization: Bearer ${stack.apiKey}\r\nContent-Type: application/json\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n`,
    );
    assert.match(await continued, /^HTTP\/1\.1 100 Continue/);
    good.destroy();

    // HTTP/2: the HEADERS alone, the body never sent.
    const h2 = http2.connect(base);
    h2.on("error", () => undefined);
    try {
      const [status, body] = await new Promise<[number, string]>((resolve, reject) => {
        const req = h2.request({ ":method": "POST", ":path": "/v1/chat/completions", "content-length": String(big) });
        let status = 0;
        let body = "";
        req.on("response", (h) => (status = Number(h[":status"])));
        req.on("data", (d) => (body += d));
        req.on("end", () => resolve([status, body]));
        req.on("error", reject);
      });
      assert.equal(status, 401);
      assert.match(body, /missing credentials/);
    } finally {
      h2.close();
    }
    // Refused, a body trickled on for ever is not read for ever: the stream is reset at the body deadline.
    const trickle = http2.connect(base);
    trickle.on("error", () => undefined);
    try {
      const start = performance.now();
      const [status, resetAfter] = await new Promise<[number, number]>((resolve) => {
        const req = trickle.request({ ":method": "POST", ":path": "/v1/chat/completions" });
        let got = 0;
        req.on("response", (h) => (got = Number(h[":status"])));
        req.on("error", () => undefined);
        req.resume();
        const drip = setInterval(() => req.writable && req.write("x".repeat(100)), 100);
        req.on("close", () => (clearInterval(drip), resolve([got, performance.now() - start])));
      });
      assert.equal(status, 401);
      assert.ok(resetAfter >= DEADLINE.body - 50 && resetAfter < DEADLINE.body + 1500, `${resetAfter}`);
    } finally {
      trickle.close();
    }
    // Every other route too, the console's API included; only the open ones answer keyless.
    for (const path of ["/troupe.v1.AdminService/ListTenants", "/v1/models", "/anything/added/later"]) {
      const r = await fetch(`${base}${path}`, { method: path.startsWith("/v1") ? "GET" : "POST" });
      assert.equal(r.status, 401, path);
    }
    assert.equal((await fetch(`${base}/healthz`)).status, 200);
    const ready = await fetch(`${base}/readyz`);
    assert.equal(ready.status, 200);
    assert.equal(await ready.text(), "ready\n");
    assert.equal((await fetch(`${base}/`)).status, 200);
  });

  test("open connections are capped: one over the cap is refused, logged and counted", async () => {
    const http = `127.0.0.1:${await freePort()}`;
    const metrics = `127.0.0.1:${await freePort()}`;
    await stack.startInstance("capped-gateway", "gateway", {
      addr: `127.0.0.1:${await freePort()}`,
      // The last --http wins over the one the stack passes (off, for an extra gateway).
      args: ["--metrics", metrics, "--http", http],
      env: { TROUPE_HTTP_MAX_CONNECTIONS: "3", TROUPE_HTTP_FIRST_BYTE_MS: "60000" },
    });
    const [host, port] = [http.split(":")[0], Number(http.split(":")[1])];
    const open = (): Promise<net.Socket> =>
      new Promise((resolve, reject) => {
        const s = net.connect(port, host, () => resolve(s));
        s.on("error", reject);
      });
    const held = [await open(), await open(), await open()];
    const over = await open();
    const refused = await untilClosed(over);
    assert.equal(refused.got, "");
    assert.ok(refused.afterMs < 1000, `the connection over the cap lived ${refused.afterMs} ms`);
    for (const s of held) assert.equal(s.destroyed, false, "the held connections stay");
    for (const s of held) s.destroy();
    await waitFor("the log line", async () =>
      /refused connections: it holds TROUPE_HTTP_MAX_CONNECTIONS/.test(stack.logs()),
    );
    const scraped = await (await fetch(`http://${metrics}/metrics`)).text();
    assert.match(scraped, /troupe_http_connections_refused_total\{[^}]*reason="max_connections"[^}]*\} [1-9]/);
    // Below the cap again, it serves.
    await waitFor(
      "serving below the cap",
      async () => (await fetch(`http://${http}/healthz`).catch(() => undefined))?.status === 200,
    );
    await stack.kill("capped-gateway");
  });
});
