// The gateway's way to call its own API for a caller, with the caller's key: its gRPC server
// bound on a private Unix socket (a directory only this user can enter; calls through it still
// need an API key), and clients over it. The HTTP edge's routes and the A2A binding use it.
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { AdminService } from "../shared/gen/troupe/v1/admin_pb.js";
import { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import { createClient, type RpcServer, type ServiceClient } from "../shared/rpc.js";

export interface Loopback {
  gateway: ServiceClient<(typeof GatewayService)["method"]>;
  admin: ServiceClient<(typeof AdminService)["method"]>;
  close(): void;
}

export async function openLoopback(server: RpcServer, maxMessageBytes: number): Promise<Loopback> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "troupe-gateway-"));
  const socket = path.join(dir, "grpc.sock");
  await server.listen(`unix:${socket}`);
  const gateway = createClient(GatewayService, `unix:${socket}`, { maxMessageBytes });
  const admin = createClient(AdminService, `unix:${socket}`, { maxMessageBytes });
  return {
    gateway,
    admin,
    close() {
      gateway.close();
      admin.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
