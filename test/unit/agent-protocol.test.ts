// The service's side of the in-sandbox agent's protocol, driven in-process with bytes a hostile
// sandbox could send. Whatever arrives, the connection either serves or ends itself (reporting
// the breach, so the sandbox is discarded); nothing it reads throws past it into the process.
// Before these checks, a forged 9-byte EXIT frame threw a RangeError out of a 'data' handler and
// took the whole sandbox service down, with every tenant's tool calls in flight.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Duplex } from "node:stream";
import { AgentConnection, AgentGone } from "../../services/sandbox/agent-connection.js";
import { MAX_FRAME } from "../../services/sandbox/agent-frames.js";
import { escapeDiagnostic } from "../../services/sandbox/agent-diagnostics.js";
import { type AgentSocket, MAX_CONNECTIONS, NET_WINDOW, NetRep, NetReq } from "../../services/sandbox/agent-socket.js";

const SYNC = Buffer.from("\0TRPSYNC", "latin1");
const REP = { hello: 64, ok: 65, err: 66, out: 67, exit: 68, file: 69, listing: 70 };

/** One of Docker's chunks: stream byte, three zero bytes, u32 length, body. */
function chunk(body: Buffer, stream = 1): Buffer {
  const head = Buffer.alloc(8);
  head[0] = stream;
  head.writeUInt32BE(body.length, 4);
  return Buffer.concat([head, body]);
}

/** One agent frame: u32 length, u8 type, u32 id, payload. */
function frame(type: number, id: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUInt32BE(5 + payload.length, 0);
  head[4] = type;
  head.writeUInt32BE(id, 5);
  return Buffer.concat([head, payload]);
}

/** A connection over an in-memory stream; `feed` is what the sandbox would send. */
function connect(onConnection?: (socket: AgentSocket) => void) {
  const written: Buffer[] = [];
  const stream = new Duplex({
    read() {},
    write(data, _enc, done) {
      written.push(Buffer.from(data));
      done();
    },
  });
  const broken: string[] = [];
  const diagnostics: string[] = [];
  const lost: string[] = [];
  const conn = AgentConnection.over(stream, {
    diagnostics: (l) => diagnostics.push(l),
    broken: (r) => broken.push(r),
    connection: onConnection,
    lost: (reason, running) => lost.push(`${reason} (${running} running)`),
  });
  const feed = (bytes: Buffer) => stream.push(bytes);
  /** Greets the agent as the service does, answering as a well-behaved agent would. */
  const greet = async () => {
    const hello = conn.hello();
    await new Promise((r) => setImmediate(r));
    const id = written.at(-1)!.readUInt32BE(5);
    feed(chunk(Buffer.concat([SYNC, frame(REP.hello, id, Buffer.from("troupe-agent/1\n"))])));
    await hello;
  };
  const lastRequestId = () => written.at(-1)!.readUInt32BE(5);
  return { conn, feed, greet, broken, diagnostics, lost, written, lastRequestId, stream };
}

const exitPayload = (code: number) => {
  const p = Buffer.alloc(9);
  p.writeInt32BE(code, 0);
  return p;
};

test("a well-formed exchange: hello, output within the window, exit", async () => {
  const c = connect();
  await c.greet();
  const out: string[] = [];
  let exit: number | undefined;
  const run = c.conn.exec(
    "echo hi",
    { timeoutMs: 1000, maxOutputBytes: 100, windowBytes: 10 },
    { output: (_s, d) => out.push(d.toString()), exit: (e) => (exit = e.exitCode), lost: () => undefined },
  );
  c.feed(chunk(frame(REP.out, run.id, Buffer.from("\x01hello"))));
  run.credit(6);
  c.feed(chunk(frame(REP.out, run.id, Buffer.from("\x01 world!!!"))));
  c.feed(chunk(frame(REP.exit, run.id, exitPayload(0))));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(out, ["hello", " world!!!"]);
  assert.equal(exit, 0);
  assert.equal(c.conn.alive, true);
  assert.deepEqual(c.broken, []);
});

test("a connection the other side ends is reported lost, with its running commands; close() is not", async () => {
  const c = connect();
  await c.greet();
  let lostErr: Error | undefined;
  c.conn.exec(
    "sleep 9",
    { timeoutMs: 9000, maxOutputBytes: 100, windowBytes: 10 },
    {
      output: () => undefined,
      exit: () => undefined,
      lost: (err) => (lostErr = err),
    },
  );
  c.stream.push(null); // the engine ends the attach
  await new Promise((r) => setImmediate(r));
  assert.equal(c.conn.alive, false);
  assert.match(lostErr!.message, /connection ended/);
  assert.deepEqual(c.lost, ["the sandbox's agent connection ended (1 running)"]);

  const ours = connect();
  await ours.greet();
  ours.conn.close();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(ours.lost, []);
});

test("forged and malformed frames end the connection, never the process", async () => {
  const cases: [string, (c: ReturnType<typeof connect>, execId: number) => Buffer, RegExp][] = [
    ["a 9-byte EXIT (the crash)", (_c, id) => chunk(frame(REP.exit, id)), /an exit of 0 bytes/],
    ["an ERR without its code", (c) => chunk(frame(REP.err, c.lastRequestId())), /error without its code/],
    [
      "an oversized length claim",
      () => chunk(Buffer.from([0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 1])),
      /a frame of 4294967295 bytes/,
    ],
    ["a length under the header", () => chunk(Buffer.from([0, 0, 0, 2, 1, 0, 0, 0, 1])), /a frame of 2 bytes/],
    [
      "output for a command that is not running",
      () => chunk(frame(REP.out, 4242, Buffer.from("\x01x"))),
      /not running/,
    ],
    ["output without its stream byte", (_c, id) => chunk(frame(REP.out, id)), /without its stream/],
    [
      "output past the credit window",
      (_c, id) => chunk(frame(REP.out, id, Buffer.concat([Buffer.from([1]), Buffer.alloc(11)]))),
      /credit window/,
    ],
    ["a reply nobody asked for", () => chunk(frame(REP.ok, 999)), /not asked/],
    ["a Docker chunk on an unknown stream", () => chunk(Buffer.from("x"), 7), /stream 7/],
    ["a Docker chunk larger than any frame", () => Buffer.from([1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]), /a chunk of/],
  ];
  for (const [name, make, why] of cases) {
    const c = connect();
    await c.greet();
    let lost: Error | undefined;
    const run = c.conn.exec(
      "x",
      { timeoutMs: 1000, maxOutputBytes: 1 << 20, windowBytes: 10 },
      { output: () => undefined, exit: () => undefined, lost: (e) => (lost = e) },
    );
    // Settled into a value at once: the rejection comes while the frame is fed.
    const pending = c.conn.readFile("f", 10).then(
      () => undefined,
      (e: Error) => e,
    );
    c.feed(make(c, run.id));
    await new Promise((r) => setImmediate(r));
    assert.equal(c.conn.alive, false, name);
    assert.equal(c.broken.length, 1, name);
    assert.match(c.broken[0], why, name);
    assert.ok(lost instanceof AgentGone, `${name}: the running command is told`);
    const failure = await pending;
    assert.ok(failure instanceof AgentGone && /broke the protocol/.test(failure.message), `${name}: ${failure}`);
  }
});

test("a 4 MB file read in Docker's small chunks, cut anywhere and mixed with stderr, arrives whole", async () => {
  const c = connect();
  await c.greet();
  const data = Buffer.alloc(4 << 20);
  for (let i = 0; i < data.length; i++) data[i] = (i * 7919) % 251;
  const reading = c.conn.readFile("big", 16 << 20);
  const id = c.lastRequestId();
  const head = Buffer.alloc(9);
  head.writeBigUInt64BE(BigInt(data.length), 0);
  const reply = frame(REP.file, id, Buffer.concat([head, data]));
  // As dockerd relays it: 32 KB chunks; each reaches us in two reads, split off-centre.
  for (let off = 0; off < reply.length; off += 32 * 1024) {
    const docker = chunk(reply.subarray(off, off + 32 * 1024));
    const cut = 3 + (off % 11);
    c.feed(docker.subarray(0, cut));
    c.feed(docker.subarray(cut));
    if (off === 64 * 1024) c.feed(chunk(Buffer.from("agent: still reading\n"), 2));
  }
  const file = await reading;
  assert.equal(file.size, data.length);
  assert.equal(file.truncated, false);
  assert.ok(file.data.equals(data), "every byte, in order");
  assert.deepEqual(c.diagnostics, ["agent: still reading"]);
  assert.equal(c.conn.alive, true);
  // The connection reads on: the next exchange is whole too.
  const next = c.conn.readFile("small", 10);
  const small = Buffer.alloc(9 + 2);
  small.writeBigUInt64BE(2n, 0);
  small.write("ok", 9);
  c.feed(chunk(frame(REP.file, c.lastRequestId(), small)));
  assert.equal((await next).data.toString(), "ok");
});

test("output over the command's cap is refused even within the window", async () => {
  const c = connect();
  await c.greet();
  const run = c.conn.exec(
    "x",
    { timeoutMs: 1000, maxOutputBytes: 4, windowBytes: 1000 },
    { output: () => undefined, exit: () => undefined, lost: () => undefined },
  );
  c.feed(chunk(frame(REP.out, run.id, Buffer.from("\x01abcdef"))));
  await new Promise((r) => setImmediate(r));
  assert.match(c.broken[0] ?? "", /over its cap of 4/);
});

test("random bytes after the greeting never throw out of the connection", async () => {
  let seed = 7;
  const rand = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
  for (let i = 0; i < 300; i++) {
    const c = connect();
    await c.greet();
    const body = Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 64) }, () => Math.floor(rand() * 256)));
    // Half in Docker's framing (so the agent's frame parser sees them), half raw.
    c.feed(i % 2 === 0 ? chunk(body) : body);
    await new Promise((r) => setImmediate(r));
    assert.ok(c.conn.alive || c.broken.length === 1);
  }
  assert.ok(MAX_FRAME > 16 << 20);
});

test("the agent's stderr reaches the log escaped and rate-limited", async () => {
  const c = connect();
  await c.greet();
  const lines = Array.from({ length: 50 }, (_, i) => `line ${i} \x1b[31mred\x1b[0m \r fake: log line`).join("\n");
  c.feed(chunk(Buffer.from(`${lines}\n`), 2));
  c.feed(chunk(Buffer.from(`${"x".repeat(5000)}\n`), 2));
  await new Promise((r) => setImmediate(r));
  assert.equal(c.diagnostics.length, 20, "at most 20 lines per window");
  for (const l of c.diagnostics) assert.doesNotMatch(l, /[\x00-\x1f]/);
  assert.match(c.diagnostics[0], /line 0 \\u001b\[31mred/);
  assert.equal(escapeDiagnostic("y".repeat(1000)).length < 400, true);
  assert.equal(c.conn.alive, true, "diagnostics are not a violation");
});

// Egress connections (agent-socket.ts): the agent names them from 0x80000000 up.
const CONN = 0x8000_0001;
const tick = () => new Promise((r) => setImmediate(r));
/** The frames this side sent for a connection, as [type, payload]. */
const sentFor = (written: Buffer[], id: number) =>
  written.filter((b) => b.readUInt32BE(5) === id).map((b) => [b[4], b.subarray(9)] as const);

test("an egress connection carries bytes both ways within each side's window", async () => {
  let socket: AgentSocket | undefined;
  const c = connect((s) => (socket = s));
  await c.greet();
  c.feed(chunk(frame(NetRep.Open, CONN)));
  await tick();
  assert.ok(socket, "the connection was handed over");
  const read: string[] = [];
  socket.on("data", (d: Buffer) => read.push(d.toString()));
  c.feed(chunk(frame(NetRep.Data, CONN, Buffer.from("GET / HTTP/1.1\r\n\r\n"))));
  await tick();
  assert.deepEqual(read, ["GET / HTTP/1.1\r\n\r\n"]);
  // Read, so credited back.
  assert.deepEqual(
    sentFor(c.written, CONN)
      .find(([t]) => t === NetReq.Credit)?.[1]
      .readUInt32BE(0),
    "GET / HTTP/1.1\r\n\r\n".length,
  );

  // Writing more than a window waits for the agent to say it wrote the first.
  let flushed = false;
  socket.write(Buffer.alloc(NET_WINDOW + 1000, "y"), () => (flushed = true));
  await tick();
  const sentBytes = () =>
    sentFor(c.written, CONN)
      .filter(([t]) => t === NetReq.Send)
      .reduce((n, [, p]) => n + p.length, 0);
  assert.equal(sentBytes(), NET_WINDOW);
  assert.equal(flushed, false);
  const w = Buffer.alloc(4);
  w.writeUInt32BE(NET_WINDOW);
  c.feed(chunk(frame(NetRep.Written, CONN, w)));
  await tick();
  assert.equal(sentBytes(), NET_WINDOW + 1000);
  assert.equal(flushed, true);

  // The command finished sending; then the agent closed it.
  let ended = false;
  let closed = false;
  socket.on("end", () => (ended = true));
  socket.on("close", () => (closed = true));
  c.feed(chunk(frame(NetRep.End, CONN, Buffer.from([0]))));
  await tick();
  assert.equal(ended, true);
  socket.end();
  await tick();
  assert.ok(sentFor(c.written, CONN).some(([t, p]) => t === NetReq.End && p[0] === 0));
  c.feed(chunk(frame(NetRep.End, CONN, Buffer.from([1]))));
  await tick();
  assert.equal(closed, true);
  // Late frames for a closed connection are not a breach.
  c.feed(chunk(frame(NetRep.Data, CONN, Buffer.from("late"))));
  await tick();
  assert.deepEqual(c.broken, []);
  assert.equal(c.conn.alive, true);
});

test("without a taker, a connection is closed at once", async () => {
  const c = connect();
  await c.greet();
  c.feed(chunk(frame(NetRep.Open, CONN)));
  await tick();
  assert.deepEqual(sentFor(c.written, CONN), [[NetReq.End, Buffer.from([1])]]);
  assert.deepEqual(c.broken, []);
});

test("what a hostile agent says of connections ends the agent connection", async () => {
  const opens = (n: number) => Buffer.concat(Array.from({ length: n }, (_, i) => chunk(frame(NetRep.Open, CONN + i))));
  const cases: [string, Buffer, RegExp][] = [
    ["an id in the request range", chunk(frame(NetRep.Open, 7)), /in the request range/],
    ["the same id opened twice", Buffer.concat([opens(1), opens(1)]), /opened twice/],
    [`more than ${MAX_CONNECTIONS} open`, opens(MAX_CONNECTIONS + 1), /more than 32 connections/],
    [
      "data past the window",
      Buffer.concat([opens(1), chunk(frame(NetRep.Data, CONN, Buffer.alloc(NET_WINDOW + 1)))]),
      /past its credit window/,
    ],
    [
      "more written than was sent",
      Buffer.concat([opens(1), chunk(frame(NetRep.Written, CONN, Buffer.from([0, 0, 0, 1])))]),
      /wrote more than it was sent/,
    ],
    [
      "an end of an unknown kind",
      Buffer.concat([opens(1), chunk(frame(NetRep.End, CONN, Buffer.from([9])))]),
      /without its kind/,
    ],
  ];
  for (const [name, bytes, why] of cases) {
    const sockets: AgentSocket[] = [];
    const c = connect((s) => {
      s.on("error", () => undefined);
      sockets.push(s);
    });
    await c.greet();
    c.feed(bytes);
    await tick();
    assert.equal(c.conn.alive, false, name);
    assert.match(c.broken[0] ?? "", why, name);
    // Every connection it had went with it.
    assert.ok(
      sockets.every((s) => s.destroyed),
      name,
    );
  }
});
