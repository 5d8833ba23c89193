// A generated service descriptor as a grpc-js service definition: paths, and messages encoded with
// protobuf-es (a request that does not parse becomes a MalformedMessage, refused before any handler).
import type * as grpc from "@grpc/grpc-js";
import {
  create,
  fromBinary,
  isMessage,
  toBinary,
  type DescMessage,
  type DescMethod,
  type DescService,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";

/** What a request that failed to parse turns into; the server rejects it before any handler sees it. */
export class MalformedMessage {
  constructor(readonly reason: string) {}
}

const asBuffer = (bytes: Uint8Array): Buffer => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);

/** Messages may also be written as bytes already encoded (a proxy forwarding what it received). */
export function serialize<D extends DescMessage>(schema: D) {
  return (msg: MessageShape<D> | MessageInitShape<D> | Uint8Array): Buffer =>
    msg instanceof Uint8Array
      ? asBuffer(msg)
      : asBuffer(toBinary(schema, isMessage(msg, schema) ? msg : create(schema, msg as MessageInitShape<D>)));
}

const passBytes = (bytes: Buffer) => bytes;

export function methodDefinition(method: DescMethod, rawResponse = false): grpc.MethodDefinition<unknown, unknown> {
  const { input, output, methodKind } = method;
  return {
    path: `/${method.parent.typeName}/${method.name}`,
    requestStream: methodKind === "client_streaming" || methodKind === "bidi_streaming",
    responseStream: methodKind === "server_streaming" || methodKind === "bidi_streaming",
    requestSerialize: serialize(input) as (m: unknown) => Buffer,
    requestDeserialize: (bytes: Buffer) => {
      try {
        return fromBinary(input, bytes);
      } catch (err) {
        return new MalformedMessage(`malformed ${input.typeName}: ${(err as Error).message}`);
      }
    },
    responseSerialize: serialize(output) as (m: unknown) => Buffer,
    responseDeserialize: rawResponse ? passBytes : (bytes: Buffer) => fromBinary(output, bytes),
    originalName: method.localName,
  };
}

/**
 * The grpc-js service definition of a protobuf-es service descriptor. Methods named in
 * rawResponses hand their responses to the caller as the received bytes, undecoded.
 */
export function serviceDefinition(service: DescService, rawResponses: readonly string[] = []): grpc.ServiceDefinition {
  const def: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const method of service.methods)
    def[method.localName] = methodDefinition(method, rawResponses.includes(method.localName));
  return def as grpc.ServiceDefinition;
}
