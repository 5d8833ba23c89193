// The baseline for bench/stream: a bare grpc-js server in its own process. Each bidi stream
// receives one request (a message count) and answers with that many small messages, honouring
// backpressure, with no Troupe code on the path.
import * as grpc from "@grpc/grpc-js";

const payload = Buffer.alloc(64, 7);
const server = new grpc.Server({ "grpc-node.max_session_memory": 64 });
const identity = (b: Buffer) => b;
server.addService(
  {
    stream: {
      path: "/bench.Raw/Stream",
      requestStream: true,
      responseStream: true,
      requestSerialize: identity,
      requestDeserialize: identity,
      responseSerialize: identity,
      responseDeserialize: identity,
    },
  },
  {
    stream: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      call.once("data", async (req: Buffer) => {
        const n = req.readUInt32BE(0);
        for (let i = 0; i < n; i++) {
          if (!call.write(payload)) await new Promise((r) => call.once("drain", r));
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
