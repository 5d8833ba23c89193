// The receive window a Troupe client gives its server (services/shared/rpc/limits.ts), as the
// server sees it on the wire: an HTTP/2 server of Node's own, not grpc-js, reads the client's
// SETTINGS and its connection-level WINDOW_UPDATE. With grpc-js's defaults both are 65,535 bytes.
import { test } from "node:test";
import assert from "node:assert/strict";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { RouterService } from "../../services/shared/gen/troupe/v1/router_pb.js";
import { createClient } from "../../services/shared/rpc.js";
import { RECEIVE_WINDOW_BYTES } from "../../services/shared/rpc/limits.js";

test("a client lets its server send 1 MiB per stream and per connection before it reads", async () => {
  const server = http2.createServer();
  const seen = new Promise<{ perStream?: number; connection?: number }>((resolve) => {
    server.on("stream", (stream) => {
      const session = stream.session!;
      const perStream = session.remoteSettings.initialWindowSize;
      // The connection window is raised by a WINDOW_UPDATE sent once the server's SETTINGS arrive.
      const started = Date.now();
      const poll = () => {
        const connection = session.state.remoteWindowSize;
        if ((connection ?? 0) > 65_535 || Date.now() - started > 2000) {
          stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
          stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "12", "grpc-message": "test" }));
          stream.end();
          resolve({ perStream, connection });
        } else setTimeout(poll, 10);
      };
      poll();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = createClient(RouterService, `127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    const call = client.resolveSession({ sessionId: "s" }).catch((err: Error) => err);
    const { perStream, connection } = await seen;
    assert.equal(RECEIVE_WINDOW_BYTES, 1024 * 1024);
    assert.equal(perStream, RECEIVE_WINDOW_BYTES, "SETTINGS_INITIAL_WINDOW_SIZE");
    assert.equal(connection, RECEIVE_WINDOW_BYTES, "the connection's window after the client's WINDOW_UPDATE");
    assert.match(String(await call), /UNIMPLEMENTED|test/);
  } finally {
    client.close();
    await new Promise((resolve) => server.close(resolve));
  }
});
