// Server reflection on the gateway: a tool with no copy of proto/ can list the services, fetch the
// schema and decode Troupe's messages from what it got; no credentials are needed for that.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { create, createFileRegistry, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import {
  ServerReflection,
  type ServerReflectionResponse,
} from "../services/shared/gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflection as AlphaReflection,
  type ServerReflectionResponse as AlphaResponse,
} from "../services/shared/gen/grpc/reflection/v1alpha/reflection_pb.js";
import { AgentEventSchema } from "../services/shared/gen/troupe/v1/session_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack({ services: ["gateway"] });
});
after(async () => {
  await stack?.stop();
});

type Request = Parameters<
  ReturnType<ReturnType<typeof createClient<(typeof ServerReflection)["method"]>>["serverReflectionInfo"]>["write"]
>[0];

/** Sends the requests on one reflection stream (no credentials) and returns the responses in order. */
async function ask(requests: Request[]): Promise<ServerReflectionResponse[]> {
  const client = createClient(ServerReflection, stack.addr.gateway);
  const call = client.serverReflectionInfo();
  const out: ServerReflectionResponse[] = [];
  const done = new Promise<void>((resolve, reject) => {
    call.on("data", (r: ServerReflectionResponse) => out.push(r));
    call.on("end", resolve);
    call.on("error", reject);
  });
  for (const r of requests) call.write(r);
  call.end();
  await done;
  client.close();
  return out;
}

test("lists the gateway's services without credentials", async () => {
  const [res] = await ask([{ messageRequest: { case: "listServices", value: "" } }]);
  assert.equal(res.messageResponse.case, "listServicesResponse");
  const names =
    res.messageResponse.case === "listServicesResponse"
      ? res.messageResponse.value.service.map((s) => s.name).sort()
      : [];
  assert.deepEqual(names, [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "lf.a2a.v1.A2AService",
    "troupe.v1.AdminService",
    "troupe.v1.GatewayService",
  ]);
  // A2A's service comes with what it imports (an A2A tool can build its messages from it).
  const [a2a] = await ask([{ messageRequest: { case: "fileContainingSymbol", value: "lf.a2a.v1.A2AService" } }]);
  const files =
    a2a.messageResponse.case === "fileDescriptorResponse"
      ? a2a.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b).name)
      : [];
  for (const f of ["lf/a2a/v1/a2a.proto", "google/protobuf/struct.proto", "google/protobuf/timestamp.proto"])
    assert.ok(files.includes(f), `${f} in ${files.join(", ")}`);
});

test("the schema fetched by symbol is enough to decode Troupe's events; unknown symbols are NOT_FOUND and the stream goes on", async () => {
  const [bySymbol, unknown, byFile] = await ask([
    { messageRequest: { case: "fileContainingSymbol", value: "troupe.v1.GatewayService" } },
    { messageRequest: { case: "fileContainingSymbol", value: "troupe.v1.NoSuchThing" } },
    { messageRequest: { case: "fileByFilename", value: "troupe/v1/gateway.proto" } },
  ]);
  assert.equal(bySymbol.messageResponse.case, "fileDescriptorResponse");
  const protos =
    bySymbol.messageResponse.case === "fileDescriptorResponse"
      ? bySymbol.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b))
      : [];
  const names = protos.map((p) => p.name);
  assert.ok(names.includes("troupe/v1/gateway.proto") && names.includes("troupe/v1/session.proto"), names.join(", "));
  assert.ok(names.indexOf("troupe/v1/session.proto") < names.indexOf("troupe/v1/gateway.proto"), "imports come first");
  const gateway = protos.find((p) => p.name === "troupe/v1/gateway.proto")!;
  const chat = gateway.service.find((s) => s.name === "GatewayService")!.method.find((m) => m.name === "Chat")!;
  assert.ok(chat.clientStreaming && chat.serverStreaming);

  // A client with nothing but these descriptors decodes an event the gateway would send.
  const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: protos }));
  const eventType = registry.getMessage("troupe.v1.AgentEvent");
  assert.ok(eventType);
  const bytes = toBinary(
    AgentEventSchema,
    create(AgentEventSchema, {
      sessionId: "s1",
      seq: 7n,
      payload: { case: "frameAccepted", value: { frameId: "f1" } },
    }),
  );
  const decoded = fromBinary(eventType, bytes) as unknown as {
    sessionId: string;
    seq: bigint;
    payload: { case: string };
  };
  assert.equal(decoded.sessionId, "s1");
  assert.equal(decoded.seq, 7n);
  assert.equal(decoded.payload.case, "frameAccepted");

  assert.equal(unknown.messageResponse.case, "errorResponse");
  assert.equal(unknown.messageResponse.case === "errorResponse" && unknown.messageResponse.value.errorCode, 5);
  assert.equal(byFile.messageResponse.case, "fileDescriptorResponse");
});

test("a client that speaks only v1alpha lists the services and fetches the schema", async () => {
  const client = createClient(AlphaReflection, stack.addr.gateway);
  const call = client.serverReflectionInfo();
  const out: AlphaResponse[] = [];
  const done = new Promise<void>((resolve, reject) => {
    call.on("data", (r: AlphaResponse) => out.push(r));
    call.on("end", resolve);
    call.on("error", reject);
  });
  call.write({ messageRequest: { case: "listServices", value: "" } });
  call.write({ messageRequest: { case: "fileContainingSymbol", value: "troupe.v1.GatewayService" } });
  call.end();
  await done;
  client.close();
  const [list, file] = out;
  assert.equal(list.messageResponse.case, "listServicesResponse");
  assert.ok(
    list.messageResponse.case === "listServicesResponse" &&
      list.messageResponse.value.service.some((s) => s.name === "troupe.v1.GatewayService"),
  );
  assert.equal(file.messageResponse.case, "fileDescriptorResponse");
  const protos =
    file.messageResponse.case === "fileDescriptorResponse"
      ? file.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b).name)
      : [];
  assert.ok(protos.includes("troupe/v1/gateway.proto"), protos.join(", "));
  assert.equal(file.originalRequest?.messageRequest.case, "fileContainingSymbol");
});
