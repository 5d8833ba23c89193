// A2A's gRPC binding (lf.a2a.v1.A2AService) on the gateway's gRPC port, beside Troupe's own
// services. A request's `tenant` names the agent (the card's gRPC interface says which; empty:
// the default agent). Errors carry google.rpc.ErrorInfo with A2A's reason and domain, which A2A
// clients map to their error types.
//
// The calls go through the gateway's own API with the caller's key: the gateway's authenticator
// keeps the key for this service's calls under CALLER_KEY (server.ts), and it is sent back to the
// gateway over its loopback socket, so limits and quotas count these calls as any others.
import type { Authenticator } from "../../shared/auth/auth.js";
import { A2AService } from "../../shared/gen/lf/a2a/v1/a2a_pb.js";
import { grpc, type ServiceImpl } from "../../shared/rpc.js";
import { type A2aCore, a2aErrorOf } from "./a2a-core.js";

const A2A_PATH = `/${A2AService.typeName}/`;

/** Where the gateway's authenticator keeps an A2A call's key for the calls made for it. */
export const CALLER_KEY = "troupe-a2a-caller-key";

/**
 * The gateway's authenticator, keeping an A2A call's key under CALLER_KEY (the authenticator
 * removes it from the call's metadata once checked). Only this service's calls keep it.
 */
export function keepingCallerKey(authenticate: Authenticator): Authenticator {
  return (metadata, path) => {
    metadata.remove(CALLER_KEY);
    const key = metadata.get("authorization")[0];
    authenticate(metadata, path);
    if (path.startsWith(A2A_PATH) && typeof key === "string") metadata.set(CALLER_KEY, key);
  };
}

/** The metadata the gateway's own API is called with for an A2A call: its key and trace context. */
function forwarded(call: { metadata: grpc.Metadata }): grpc.Metadata {
  const out = new grpc.Metadata();
  const key = call.metadata.get(CALLER_KEY)[0];
  if (typeof key === "string") out.set("authorization", key);
  for (const name of ["traceparent", "tracestate"]) {
    const v = call.metadata.get(name)[0];
    if (typeof v === "string") out.set(name, v);
  }
  return out;
}

export function a2aGrpc(core: () => A2aCore): ServiceImpl<(typeof A2AService)["method"]> {
  const unary =
    <T>(fn: (md: grpc.Metadata) => Promise<T>) =>
    async (md: grpc.Metadata): Promise<T> => {
      try {
        return await fn(md);
      } catch (err) {
        throw a2aErrorOf(err);
      }
    };
  // The updates end with the call (ctx.signal); an A2A failure is mapped as a unary call's is.
  async function* stream<T>(updates: AsyncIterable<T>): AsyncIterable<T> {
    try {
      yield* updates;
    } catch (err) {
      throw a2aErrorOf(err);
    }
  }
  return {
    sendMessage: (req, call) => unary((md) => core().sendMessage(req, req.tenant, md))(forwarded(call)),
    getTask: (req, call) => unary((md) => core().getTask(req, md))(forwarded(call)),
    cancelTask: (req, call) => unary((md) => core().cancelTask(req, md))(forwarded(call)),
    sendStreamingMessage: (req, ctx) =>
      stream(core().sendStreamingMessage(req, req.tenant, forwarded(ctx), ctx.signal)),
    subscribeToTask: (req, ctx) => stream(core().subscribeToTask(req, forwarded(ctx), ctx.signal)),
  };
}
