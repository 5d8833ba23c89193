// Where a caller's session lives: the router's answer per (caller, session), cached and bounded,
// and one client per runner address.
import { identityMetadata, type Identity } from "../shared/auth/auth.js";
import { refKey, refOf } from "../shared/session-ref.js";
import { SESSION_OWNER_KEY, Status, grpcCode } from "../shared/errors.js";
import type { RouterService, ResolveSessionResponse } from "../shared/gen/troupe/v1/router_pb.js";
import { RunnerService } from "../shared/gen/troupe/v1/runner_pb.js";
import { createClient, type grpc, type ServiceClient } from "../shared/rpc.js";
import type { RunnerCall } from "./passthrough.js";
import { RunnerMux } from "./runner-mux.js";

type RunnerClient = ServiceClient<(typeof RunnerService)["method"]>;
type RouterClient = ServiceClient<(typeof RouterService)["method"]>;

/**
 * (caller, session) -> owning runner, from the router. Bounded; dropped when the runner is gone.
 * Sessions are named by their owner (session-ref.ts), so entries are too.
 */
export class PlacementCache {
  private readonly entries = new Map<string, ResolveSessionResponse>();
  constructor(
    private readonly router: RouterClient,
    private readonly capacity = 100_000,
  ) {}

  async resolve(caller: Identity, sessionId: string, agentId: string): Promise<ResolveSessionResponse> {
    const key = refKey(refOf(caller, sessionId));
    const hit = sessionId ? this.entries.get(key) : undefined;
    if (hit) {
      // Refresh recency: a Map iterates in insertion order, so the first key is the least recent.
      this.entries.delete(key);
      this.entries.set(key, hit);
      return hit;
    }
    const res = await this.router.resolveSession({ sessionId, agentId }, { metadata: identityMetadata(caller) });
    this.entries.set(refKey(refOf(caller, res.sessionId)), res);
    if (this.entries.size > this.capacity) this.entries.delete(this.entries.keys().next().value!);
    return res;
  }

  invalidate(caller: Identity, sessionId: string): void {
    this.entries.delete(refKey(refOf(caller, sessionId)));
  }

  /**
   * Reacts to a runner's refusal. Returns whether a retry can succeed: the runner is gone (ask
   * the router again), or the session is live on another runner (go there; placement changed
   * while its owner kept running, and the owner keeps it until it passivates).
   */
  reroute(caller: Identity, sessionId: string, err: unknown): boolean {
    const code = grpcCode(err);
    if (code === Status.UNAVAILABLE) {
      this.invalidate(caller, sessionId);
      return true;
    }
    if (code !== Status.ABORTED) return false;
    const owner = (err as { metadata?: grpc.Metadata }).metadata?.get(SESSION_OWNER_KEY)[0];
    const key = refKey(refOf(caller, sessionId));
    const hit = this.entries.get(key);
    if (typeof owner === "string" && owner !== "" && hit && hit.runner?.address !== owner) {
      this.entries.set(key, { ...hit, runner: { ...hit.runner!, runnerId: "", address: owner } });
    } else {
      this.invalidate(caller, sessionId);
    }
    return true;
  }
}

export class RunnerPool {
  private readonly clients = new Map<string, RunnerClient>();
  private readonly muxes = new Map<string, RunnerMux>();
  constructor(
    private readonly maxMessageBytes: number,
    private readonly headers: Record<string, string>,
    private readonly tls?: { ca: Buffer },
  ) {}
  /**
   * A client stream's session stream to the runner at `address`, acting for `caller`: a
   * sub-stream of the one AttachMany call to that runner (runner-mux.ts).
   */
  attach(address: string, caller: grpc.Metadata): RunnerCall {
    let mux = this.muxes.get(address);
    if (!mux) this.muxes.set(address, (mux = new RunnerMux(this.get(address))));
    return mux.attach(caller);
  }
  get(address: string): RunnerClient {
    let c = this.clients.get(address);
    if (!c) {
      // Session streams are forwarded as bytes: see needsDecoding.
      c = createClient(RunnerService, address, {
        maxMessageBytes: this.maxMessageBytes,
        rawResponses: ["attachMany"],
        headers: this.headers,
        tls: this.tls,
      });
      this.clients.set(address, c);
    }
    return c;
  }
  /** After the gateway's drain: ends the AttachMany calls, then closes the channels. */
  close(): void {
    for (const m of this.muxes.values()) m.close();
    this.muxes.clear();
    for (const c of this.clients.values()) c.close();
  }
}
