// The gateway's HTTP face (http-edge.ts), tested the way its clients speak: Connect's own client
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
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
let base = "";
const CONSOLE = "https://console.example";

before(async () => {
  stack = await startStack({ env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0", TROUPE_HTTP_CORS: CONSOLE } });
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
    assert.equal((await fetch(`${base}/nowhere`)).status, 404);
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
