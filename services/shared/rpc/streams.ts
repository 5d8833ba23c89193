// Writing to a stream with backpressure.
import { RpcError, Status } from "../errors.js";

/**
 * Write one message honouring backpressure: resolves at once while the stream has room, and
 * after 'drain' once grpc-js reports its buffer full. Rejects if the stream closes first.
 */
export function write<T>(
  stream: {
    write(msg: T): boolean;
    once(ev: string, fn: (...a: unknown[]) => void): unknown;
    removeListener(ev: string, fn: (...a: unknown[]) => void): unknown;
  },
  msg: T,
): Promise<void> | undefined {
  if (stream.write(msg)) return undefined;
  return new Promise((resolve, reject) => {
    const onDrain = () => {
      cleanup();
      resolve();
    };
    const onClose = () => {
      cleanup();
      reject(new RpcError(Status.CANCELLED, "stream closed"));
    };
    const cleanup = () => {
      stream.removeListener("drain", onDrain);
      stream.removeListener("close", onClose);
      stream.removeListener("cancelled", onClose);
      stream.removeListener("error", onClose);
    };
    stream.once("drain", onDrain);
    stream.once("close", onClose);
    stream.once("cancelled", onClose);
    stream.once("error", onClose);
  });
}
