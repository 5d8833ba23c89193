// The baseline for bench/stream: a bare grpc-js server in its own process. Each bidi stream
// receives one request (a message count, and for the paced mode a rate) and answers with that
// many small messages, honouring backpressure, with no Troupe code on the path.
import * as grpc from "@grpc/grpc-js";
import { bytesStreamMethod } from "./bytes-method.js";

const payload = Buffer.alloc(64, 7);
/** A 64-byte message starting with the wall-clock time of its write, in ms. */
const stamped = () => {
  const b = Buffer.alloc(64, 7);
  b.writeDoubleBE(performance.timeOrigin + performance.now(), 0);
  return b;
};
const server = new grpc.Server({ "grpc-node.max_session_memory": 64 });
server.addService(
  {
    stream: bytesStreamMethod("/bench.Raw/Stream"),
  },
  {
    stream: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      call.once("data", async (req: Buffer) => {
        const n = req.readUInt32BE(0);
        // Paced (a rate in the request): one message every 1/rate s, each carrying its write time,
        // timed as the scripted model times its tokens.
        const rate = req.length >= 8 ? req.readUInt32BE(4) : 0;
        for (let i = 0; i < n; i++) {
          if (rate > 0) await new Promise((r) => setTimeout(r, 1000 / rate));
          const message = rate > 0 ? stamped() : payload;
          if (!call.write(message)) await new Promise((r) => call.once("drain", r));
        }
        call.end();
      });
    },
  },
);
server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) throw err;
  process.stdout.write(`${port}\n`);
});
process.on("SIGTERM", () => server.forceShutdown());
