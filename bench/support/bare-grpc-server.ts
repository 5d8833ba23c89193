// The footprint baseline: a Node process serving one gRPC service over grpc-js and nothing more.
import * as grpc from "@grpc/grpc-js";

const server = new grpc.Server();
server.addService(
  {
    check: {
      path: "/grpc.health.v1.Health/Check",
      requestStream: false,
      responseStream: false,
      requestSerialize: (b: Buffer) => b,
      requestDeserialize: (b: Buffer) => b,
      responseSerialize: (b: Buffer) => b,
      responseDeserialize: (b: Buffer) => b,
    },
  },
  { check: (_call: unknown, cb: grpc.sendUnaryData<Buffer>) => cb(null, Buffer.from([8, 1])) },
);
server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) throw err;
  console.log(`listening ${port}`);
});
