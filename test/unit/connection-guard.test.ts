// The HTTP edge's connection guard (services/gateway/http/connection-guard.ts) in-process, on a
// real HTTP/1.1 server and a keep-alive client: what one request arms is gone when it is done,
// so a connection that carries many requests holds no more than one does.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { ConnectionGuard } from "../../services/gateway/http/connection-guard.js";
import { quietLogger } from "../helpers/in-process.js";

test("a kept-alive connection's requests leave no listener behind", async () => {
  const limits = { firstByteMs: 5000, headMs: 5000, bodyMs: 5000, idleMs: 5000, maxConnections: 10 };
  const guard = new ConnectionGuard(limits, quietLogger);
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    sockets.add(req.socket);
    guard.request(req, res);
    req.resume();
    req.on("end", () => res.end("ok"));
  });
  server.on("connection", (socket: Socket) => guard.http1(socket));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const port = (server.address() as AddressInfo).port;
    const post = () =>
      new Promise<void>((resolve, reject) =>
        http
          .request({ port, method: "POST", agent }, (res) => res.resume().on("end", resolve))
          .on("error", reject)
          .end("body"),
      );
    await post();
    const [socket] = sockets;
    const after = (name: string) => socket!.listenerCount(name);
    const one = { close: after("close"), end: after("end") };
    for (let i = 0; i < 30; i++) await post();
    assert.equal(sockets.size, 1, "one connection carried them all");
    assert.deepEqual({ close: after("close"), end: after("end") }, one);
  } finally {
    agent.destroy();
    server.close();
  }
});
