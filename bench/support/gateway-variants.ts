// Servers for bench/gateway, in a process of their own: the same unary call and the same stream
// open served three ways, with handlers that do nothing else, so what differs is only the layer
// under test:
//   bare     grpc-js alone (no Troupe code);
//   adapter  Troupe's RpcServer (descriptor adapter, malformed-input check, spans), no auth;
//   auth     the same, plus the gateway's API-key interceptor and a cached session placement.
// Prints "bare=PORT adapter=PORT auth=PORT" when all three listen.
import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";
import { ApiKeys } from "../../services/shared/auth/api-keys.js";
import { apiKeyAuth, identityOf } from "../../services/shared/auth/auth.js";
import {
  ChatResponseSchema,
  GatewayService,
  SendMessageResponseSchema,
} from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import { RouterService } from "../../services/shared/gen/troupe/v1/router_pb.js";
import { PlacementCache } from "../../services/gateway/placement.js";
import { RpcServer, createClient } from "../../services/shared/rpc.js";
import { exitProcess } from "../../services/shared/process/exit.js";

const keysJson = process.argv[2];
const same = (b: Buffer) => b;
const sendResponse = Buffer.from(toBinary(SendMessageResponseSchema, create(SendMessageResponseSchema, {})));
const opened = Buffer.from(
  toBinary(ChatResponseSchema, create(ChatResponseSchema, { kind: { case: "opened", value: { sessionId: "s" } } })),
);

const bare = new grpc.Server();
bare.addService(
  {
    sendMessage: {
      path: "/troupe.v1.GatewayService/SendMessage",
      requestStream: false,
      responseStream: false,
      requestSerialize: same,
      requestDeserialize: same,
      responseSerialize: same,
      responseDeserialize: same,
    },
    chat: {
      path: "/troupe.v1.GatewayService/Chat",
      requestStream: true,
      responseStream: true,
      requestSerialize: same,
      requestDeserialize: same,
      responseSerialize: same,
      responseDeserialize: same,
    },
  },
  {
    sendMessage: (_call: unknown, cb: grpc.sendUnaryData<Buffer>) => cb(null, sendResponse),
    chat: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      call.once("data", () => {
        call.write(opened);
        call.end();
      });
    },
  },
);
const bind = (server: grpc.Server) =>
  new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, port) =>
      err ? reject(err) : resolve(port),
    ),
  );

// A router that always answers the same placement (the cache asks it once per session).
const router = new RpcServer().add(RouterService, {
  resolveSession: async (req) => ({
    sessionId: req.sessionId,
    agentId: "main",
    sessionKey: `agent:main:${req.sessionId}`,
    runner: { runnerId: "r", address: "127.0.0.1:1" },
  }),
  registerRunner: async () => ({ leaseTtlMs: 1000 }),
  listRunners: async () => ({ runners: [] }),
  resolveInbound: async () => ({}),
});
const routerPort = await router.listen("127.0.0.1:0");
const placements = new PlacementCache(createClient(RouterService, `127.0.0.1:${routerPort}`));

const keys = await ApiKeys.load("/nonexistent/keys.json", keysJson);
const handlers = (auth: boolean) =>
  ({
    async sendMessage(req: { sessionId: string }, call: { metadata: grpc.Metadata }) {
      if (auth) {
        await placements.resolve(identityOf(call.metadata), req.sessionId, "");
      }
      return {};
    },
    chat(
      call: grpc.ServerDuplexStream<{ frame?: { kind: { case?: string; value?: { sessionId?: string } } } }, unknown>,
    ) {
      call.once("data", async (req) => {
        if (auth) {
          const v = req.frame?.kind.value;
          await placements.resolve(identityOf(call.metadata), v?.sessionId ?? "s", "");
        }
        call.write({ kind: { case: "opened", value: { sessionId: "s" } } });
        call.end();
      });
    },
  }) as never;
const adapter = new RpcServer().add(GatewayService, handlers(false));
const withAuth = new RpcServer({ authenticate: apiKeyAuth(keys) }).add(GatewayService, handlers(true));

const ports = {
  bare: await bind(bare),
  adapter: await adapter.listen("127.0.0.1:0"),
  auth: await withAuth.listen("127.0.0.1:0"),
};
process.stdout.write(`bare=${ports.bare} adapter=${ports.adapter} auth=${ports.auth}\n`);
process.on("SIGTERM", () => void exitProcess(0));
