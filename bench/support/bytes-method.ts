// A bidi gRPC method whose messages are bytes as they are: the benchmarks' bare servers and
// relays, which measure grpc-js with no (de)serialization of their own.
const identity = (b: Buffer) => b;

export const bytesStreamMethod = (path: string) => ({
  path,
  requestStream: true,
  responseStream: true,
  requestSerialize: identity,
  requestDeserialize: identity,
  responseSerialize: identity,
  responseDeserialize: identity,
});
