// The gateway: Troupe's public gRPC face. It validates what clients send, asks the router once per
// session which runner owns it (and caches the answer), then connects the client's stream straight
// to that runner. Events flow runner -> gateway -> client with backpressure honoured at each step;
// the router is never on that path.
import { create, fromBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { SpanKind, trace, type Context, type Span } from "@opentelemetry/api";
import { createHash } from "node:crypto";
import { ApiKeys, NAME } from "../shared/api-keys.js";
import { apiKeyAuth, callerOf, identityHeaders, identityMetadata, identityOf, internalCredentials, type Identity } from "../shared/auth.js";
import { refKey, refOf } from "../shared/session-ref.js";
import type { Config } from "../shared/config.js";
import { RpcError, SESSION_OWNER_KEY, Status, grpcCode, invalidArgument, invalidArgumentIf, permissionDenied, toStatus, unavailable } from "../shared/errors.js";
import { catchStopCommand, validateFrame, validateSessionRef } from "../shared/frames.js";
import { GatewayService, SubscribeResponseSchema, type ChatRequest } from "../shared/gen/troupe/v1/gateway_pb.js";
import { Health } from "../shared/gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../shared/gen/grpc/reflection/v1/reflection_pb.js";
import { reflectionService } from "../shared/reflection.js";
import { normaliseInbound } from "./inbound.js";
import { GatewayLimits, limitsFromEnv } from "./limits.js";
import { TenantQuotas, quotasFromEnv } from "../shared/quotas.js";
import { RouterService, type ResolveSessionResponse } from "../shared/gen/troupe/v1/router_pb.js";
import { AttachResponseSchema, RunnerService, type AttachRequestSchema, type AttachResponse } from "../shared/gen/troupe/v1/runner_pb.js";
import { AgentEventSchema, ClientFrameSchema, type ClientFrame, type SessionInfo } from "../shared/gen/troupe/v1/session_pb.js";
import { DEFAULT_AGENT } from "../shared/ids.js";
import type { Logger } from "../shared/log.js";
import { RpcServer, createClient, grpc, type ServiceClient } from "../shared/rpc.js";
import type { RunningService } from "../shared/service.js";
import { GenAI, contextToRecord, extractContext, tracer } from "../shared/telemetry.js";

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

class RunnerPool {
  private readonly clients = new Map<string, RunnerClient>();
  constructor(
    private readonly maxMessageBytes: number,
    private readonly headers: Record<string, string>,
  ) {}
  get(address: string): RunnerClient {
    let c = this.clients.get(address);
    if (!c) {
      // Session streams are forwarded as bytes: see needsDecoding.
      c = createClient(RunnerService, address, { maxMessageBytes: this.maxMessageBytes, rawResponses: ["attach", "replay"], headers: this.headers });
      this.clients.set(address, c);
    }
    return c;
  }
  close(): void {
    for (const c of this.clients.values()) c.close();
  }
}

// The runner's AttachResponse and the client's ChatResponse (likewise ReplayResponse and
// SubscribeResponse) have the same fields under the same numbers, so the runner's bytes are the
// client's bytes: the gateway forwards them without decoding and re-encoding every token. It
// decodes only what it acts on: the open answer and the events that delimit turns for tracing.
const OPENED = AttachResponseSchema.field.opened.number;
const EVENT = AttachResponseSchema.field.event.number;
const OBSERVED = new Set([AgentEventSchema.field.agentStart.number, AgentEventSchema.field.agentEnd.number, AgentEventSchema.field.queueApplied.number]);

/** Whether a runner response is one the gateway must look into; most are only forwarded. */
export function needsDecoding(bytes: Uint8Array): boolean {
  const r = new BinaryReader(bytes);
  while (r.pos < r.len) {
    const [no, wire] = r.tag();
    if (no === OPENED) return true;
    if (no === EVENT && wire === WireType.LengthDelimited) {
      const ev = new BinaryReader(r.bytes());
      while (ev.pos < ev.len) {
        const [field, w] = ev.tag();
        if (OBSERVED.has(field)) return true;
        ev.skip(w, field);
      }
      return false;
    }
    r.skip(wire, no);
  }
  return false;
}

type AttachRequestInit = MessageInitShape<typeof AttachRequestSchema>;

/**
 * Leaves a runner's Attach stream without resetting it: `detach`, then half-close; the runner
 * ends the stream. HTTP/2 servers close a connection that resets streams too fast (nghttp2 allows
 * a burst of about 1,000), and one connection carries every client's stream to that runner, so a
 * wave of clients leaving must not become a wave of resets. A runner that does not answer within
 * 10 s is reset after all.
 */
function leaveRunnerCall(rc: grpc.ClientDuplexStream<AttachRequestInit, unknown>): void {
  rc.on("error", () => undefined);
  try {
    rc.write({ detach: true });
    rc.end();
  } catch {
    rc.cancel();
    return;
  }
  rc.resume();
  const timer = setTimeout(() => rc.cancel(), 10_000);
  timer.unref();
  rc.once("status", () => clearTimeout(timer));
}

/**
 * An AttachResponse carrying an event, as the SubscribeResponse with that event: the event's bytes
 * are the same, only the field number differs (2 there, 1 here), so one tag byte changes. Anything
 * else (the `opened` answer) is not for a subscriber: undefined.
 */
function asSubscribeResponse(bytes: Buffer): Buffer | undefined {
  const eventTag = (EVENT << 3) | WireType.LengthDelimited;
  if (bytes.length === 0 || bytes[0] !== eventTag) return undefined;
  const out = Buffer.from(bytes);
  out[0] = (SubscribeResponseSchema.field.event.number << 3) | WireType.LengthDelimited;
  return out;
}

/**
 * One span per turn the client starts, named invoke_agent as the GenAI conventions say for a
 * remote agent call. Its context travels inside the frame, so the runner's spans join it.
 */
class TurnSpans {
  private readonly byFrame = new Map<string, Span>();
  private readonly byTurn = new Map<string, Span>();
  constructor(
    private readonly parent: Context,
    private readonly sessionId: () => string,
    private readonly agentId: () => string,
  ) {}

  /** Returns the frame with trace context added. */
  start(frame: ClientFrame): ClientFrame {
    const kind = frame.kind.case;
    if (kind !== "prompt" && kind !== "followUp" && kind !== "steer") return frame;
    const span = tracer.startSpan(
      `invoke_agent ${this.agentId()}`,
      {
        kind: SpanKind.CLIENT,
        attributes: { [GenAI.OPERATION_NAME]: "invoke_agent", [GenAI.AGENT_ID]: this.agentId(), [GenAI.CONVERSATION_ID]: this.sessionId() },
      },
      this.parent,
    );
    this.byFrame.set(frame.frameId, span);
    return create(ClientFrameSchema, { ...frame, traceContext: contextToRecord(trace.setSpan(this.parent, span)) });
  }

  observe(resp: AttachResponse): void {
    if (resp.kind.case !== "event" || this.byFrame.size + this.byTurn.size === 0) return;
    const ev = resp.kind.value;
    const p = ev.payload;
    if (p.case === "agentStart") {
      const span = this.byFrame.get(p.value.frameId);
      if (span) {
        this.byFrame.delete(p.value.frameId);
        this.byTurn.set(ev.turnId, span);
      }
    } else if (p.case === "agentEnd") {
      this.byTurn.get(ev.turnId)?.end();
      this.byTurn.delete(ev.turnId);
    } else if (p.case === "queueApplied") {
      // A steer or follow-up joined a run traced by its prompt's span: its own span ends here.
      // (A prompt's span was moved to byTurn at agent_start, which comes first.)
      this.byFrame.get(p.value.frameId)?.end();
      this.byFrame.delete(p.value.frameId);
    }
  }

  endAll(): void {
    for (const s of [...this.byFrame.values(), ...this.byTurn.values()]) s.end();
    this.byFrame.clear();
    this.byTurn.clear();
  }
}

/**
 * A canonical sender as a memory owner: as it is when it fits the memory service's alphabet, else
 * a hash of it under a prefix no channel name can have (channel names have no '.'). An unlinked
 * sender is "channel:id" and principals have no ':', so a sender is never a principal's memory
 * owner unless routing's identityLinks say so.
 */
function memoryOwnerOf(sender: string): string {
  return NAME.test(sender) ? sender : `hashed.sender:${createHash("sha256").update(sender).digest("hex")}`;
}

/** Open streams by the hash of the key they came with, so a revoked key's streams end. */
class StreamsByKey {
  private readonly byKey = new Map<string, Set<(err: RpcError) => void>>();

  /** Registers a stream's way to end; returns its removal. */
  add(keyHash: string, end: (err: RpcError) => void): () => void {
    let set = this.byKey.get(keyHash);
    if (!set) this.byKey.set(keyHash, (set = new Set()));
    set.add(end);
    return () => {
      set.delete(end);
      if (set.size === 0 && this.byKey.get(keyHash) === set) this.byKey.delete(keyHash);
    };
  }

  /** Ends every stream whose key is no longer accepted. */
  endRevoked(holds: (keyHash: string) => boolean): number {
    let ended = 0;
    for (const [hash, set] of [...this.byKey]) {
      if (holds(hash)) continue;
      this.byKey.delete(hash);
      for (const end of set) {
        end(new RpcError(Status.UNAUTHENTICATED, "this API key was revoked"));
        ended++;
      }
    }
    return ended;
  }
}

/**
 * The metadata that carries a client's verified identity (set by apiKeyAuth) on to the runner,
 * which serves a session only to its owner.
 */
function onBehalfOf(call: { metadata: grpc.Metadata }): grpc.Metadata {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(identityHeaders(identityOf(call.metadata)))) md.set(k, v);
  return md;
}

export async function startGateway(cfg: Config, logger: Logger): Promise<RunningService> {
  const internal = await internalCredentials(cfg.dataDir);
  const keys = await ApiKeys.load(cfg.apiKeysFile, process.env.TROUPE_API_KEYS ?? "");
  keys.watch(2000, (err) => logger.error("API keys file does not parse; keeping only the keys still named in it", { error: String((err as Error).message ?? err) }));
  // A revoked key's open streams end at the next reload (every 2 s), not when they next send.
  const streams = new StreamsByKey();
  keys.onRevoked(() => {
    const ended = streams.endRevoked((hash) => keys.holds(hash));
    if (ended > 0) logger.info(`ended ${ended} streams of revoked API keys`);
  });
  if (keys.size === 0) logger.warn(`no API keys configured: every call will be refused until one exists (troupe keys create, or ${cfg.apiKeysFile})`);
  const limits = new GatewayLimits(limitsFromEnv(process.env));
  const quotas = await new TenantQuotas(quotasFromEnv(process.env), cfg.quotasFile).start((err) => logger.error("quotas file rejected; keeping the quotas read before", { error: String((err as Error).message ?? err) }));
  /** Prompts, steering and follow-ups draw from the tenant's and the session's budgets; aborts from the tenant's abort quota. */
  const admit = (tenant: string, sessionId: string, frame: ClientFrame) => {
    const kind = frame.kind.case;
    if (kind === "prompt" || kind === "steer" || kind === "followUp") limits.admitMessage(tenant, sessionId);
    else if (kind === "abort") limits.admitAbort(tenant, quotas.of(tenant).abortsPerSecond);
  };
  const router = createClient(RouterService, cfg.addr.router, { headers: internal.headers });
  const placements = new PlacementCache(router);
  const runners = new RunnerPool(cfg.maxMessageBytes, internal.headers);

  /** Calls the caller's session's runner; if it is gone or the session moved, retries once where it is now. */
  const withRunner = async <T>(call: { metadata: grpc.Metadata }, sessionId: string, fn: (runner: RunnerClient, placement: ResolveSessionResponse) => Promise<T>): Promise<T> => {
    validateSessionRef(sessionId, "", false);
    const who = identityOf(call.metadata);
    for (let attempt = 0; ; attempt++) {
      const placement = await placements.resolve(who, sessionId, "");
      try {
        return await fn(runners.get(placement.runner!.address), placement);
      } catch (err) {
        if (attempt > 0 || !placements.reroute(who, sessionId, err)) throw err;
      }
    }
  };

  const submit = async (sessionId: string, sent: ClientFrame, call: { metadata: grpc.Metadata }) => {
    const metadata = call.metadata;
    const caller = onBehalfOf(call);
    validateFrame(sent, true, true);
    const frame = catchStopCommand(sent);
    admit(identityOf(metadata).tenant, sessionId, frame);
    const spans = new TurnSpans(extractContext(metadata), () => sessionId, () => "");
    const traced = spans.start(frame);
    try {
      const res = await withRunner(call, sessionId, (runner) => runner.submit({ sessionId, frame: traced }, { metadata: caller }));
      return { accepted: res.accepted };
    } finally {
      spans.endAll();
    }
  };

  const server = new RpcServer({ maxMessageBytes: cfg.maxMessageBytes, authenticate: apiKeyAuth(keys) });
  server.add(GatewayService, {
    chat(call) {
      let state: "awaiting-open" | "opening" | "open" | "done" = "awaiting-open";
      let runnerCall: grpc.ClientDuplexStream<AttachRequestInit, Buffer> | undefined;
      const queued: ClientFrame[] = [];
      let halfClosed = false;
      let sessionId = "";
      let agentId = DEFAULT_AGENT;
      const spans = new TurnSpans(extractContext(call.metadata), () => sessionId, () => agentId);
      const caller = onBehalfOf(call);
      const who = identityOf(call.metadata);
      const tenant = who.tenant;
      let releaseStream: (() => void) | undefined;
      const unwatch = streams.add(callerOf(call.metadata).keyHash, (err) => finish(err));

      const finish = (err?: unknown) => {
        if (state === "done") return;
        state = "done";
        unwatch();
        spans.endAll();
        releaseStream?.();
        if (err !== undefined && toStatus(err).code === Status.INTERNAL) logger.error("chat stream failed", { error: String((err as Error)?.stack ?? err) });
        if (err !== undefined) {
          runnerCall?.cancel();
          if (!call.cancelled) call.emit("error", toStatus(err));
        } else if (!call.cancelled) call.end();
      };
      const forward = (frame: ClientFrame) => {
        if (!runnerCall!.write({ frame })) {
          call.pause();
          runnerCall!.once("drain", () => call.resume());
        }
      };

      const open = async (openFrame: ClientFrame, attempt: number): Promise<void> => {
        const o = openFrame.kind.case === "open" ? openFrame.kind.value : undefined;
        const placement = await placements.resolve(who, o?.sessionId ?? "", o?.agentId ?? "");
        sessionId = placement.sessionId;
        agentId = placement.agentId;
        // A session the router named for us is new: the runner must create it.
        const frame = o?.sessionId ? openFrame : create(ClientFrameSchema, { ...openFrame, kind: { case: "open", value: { ...o!, sessionId, create: true } } });
        const rc = runners.get(placement.runner!.address).attach({ metadata: caller }) as unknown as grpc.ClientDuplexStream<AttachRequestInit, Buffer>;
        runnerCall = rc;
        let received = false;
        rc.on("data", (bytes: Buffer) => {
          received = true;
          if (state === "done") return;
          if (needsDecoding(bytes)) {
            const resp = fromBinary(AttachResponseSchema, bytes);
            if (resp.kind.case === "opened") {
              agentId = resp.kind.value.agentId;
              state = "open";
              for (const f of queued.splice(0)) forward(f);
              if (halfClosed) rc.end();
            }
            spans.observe(resp);
          }
          if (!call.write(bytes as never)) {
            rc.pause();
            call.once("drain", () => rc.resume());
          }
        });
        let upstreamFailed = false;
        rc.on("error", (err) => {
          upstreamFailed = true;
          if (!received && attempt === 0 && state !== "done" && placements.reroute(who, sessionId, err)) {
            open(openFrame, 1).catch(finish);
            return;
          }
          finish(err);
        });
        // grpc-js may end the readable side of a call that failed too: only a clean end is one.
        rc.on("end", () => {
          if (!upstreamFailed) finish();
        });
        rc.write({ frame });
      };

      call.on("data", (req: ChatRequest) => {
        try {
          const frame = req.frame;
          if (state === "done") return;
          if (state === "awaiting-open") {
            validateFrame(frame, false, true);
            releaseStream = limits.openStream(tenant);
            state = "opening";
            open(frame, 0).catch(finish);
            return;
          }
          validateFrame(frame, true, true);
          const stopAware = catchStopCommand(frame);
          // Over a limit, the stream ends with RESOURCE_EXHAUSTED and when to retry; frames not
          // yet acknowledged are the client's to resend, as after any broken stream.
          admit(tenant, sessionId, stopAware);
          const traced = spans.start(stopAware);
          if (state === "opening") queued.push(traced);
          else forward(traced);
        } catch (err) {
          finish(err);
        }
      });
      // The client is done sending: pass that on once its frames are forwarded; the runner ends
      // the stream when the session has nothing left to do.
      call.on("end", () => {
        halfClosed = true;
        if (state === "open") runnerCall!.end();
        else if (state === "awaiting-open") finish();
      });
      call.on("cancelled", () => {
        state = "done";
        unwatch();
        spans.endAll();
        releaseStream?.();
        if (runnerCall) leaveRunnerCall(runnerCall);
      });
    },

    async createSession(req, call) {
      validateSessionRef(req.sessionId, req.agentId, true);
      const first = await placements.resolve(identityOf(call.metadata), req.sessionId, req.agentId);
      const res = await withRunner(call, first.sessionId, (runner, placement) =>
        runner.ensureSession({ open: { sessionId: placement.sessionId, agentId: first.agentId, create: true, queueMode: req.queueMode } }, { metadata: onBehalfOf(call) }),
      );
      return { session: res.session };
    },

    sendMessage: (req, call) =>
      submit(req.sessionId, create(ClientFrameSchema, { frameId: req.frameId, kind: { case: "prompt", value: { text: req.text, queueMode: req.queueMode } } }), call),
    steer: (req, call) => submit(req.sessionId, create(ClientFrameSchema, { frameId: req.frameId, kind: { case: "steer", value: { text: req.text } } }), call),
    followUp: (req, call) => submit(req.sessionId, create(ClientFrameSchema, { frameId: req.frameId, kind: { case: "followUp", value: { text: req.text } } }), call),
    abort: (req, call) =>
      submit(req.sessionId, create(ClientFrameSchema, { frameId: req.frameId, kind: { case: "abort", value: { reason: req.reason, clearQueue: req.clearQueue } } }), call),

    // Served over the runner's Attach stream (open with replay_after_seq, no create) rather than
    // Replay, so that a client leaving ends the runner's stream without a reset.
    async subscribe(call) {
      const { sessionId, afterSeq } = call.request;
      validateSessionRef(sessionId, "", false);
      let upstream: grpc.ClientDuplexStream<AttachRequestInit, Buffer> | undefined;
      const caller = onBehalfOf(call);
      const who = identityOf(call.metadata);
      const release = limits.openStream(who.tenant);
      // A revoked key's subscription ends too.
      const unwatch = streams.add(callerOf(call.metadata).keyHash, (err) => {
        if (upstream) leaveRunnerCall(upstream);
        if (!call.cancelled) call.emit("error", toStatus(err));
      });
      for (const ev of ["close", "cancelled", "finish", "error"] as const) {
        call.once(ev, release);
        call.once(ev, unwatch);
      }
      call.on("cancelled", () => upstream && leaveRunnerCall(upstream));
      const attempt = async (n: number): Promise<void> => {
        const placement = await placements.resolve(who, sessionId, "");
        if (call.cancelled) return;
        const up = runners.get(placement.runner!.address).attach({ metadata: caller }) as unknown as grpc.ClientDuplexStream<AttachRequestInit, Buffer>;
        upstream = up;
        let received = false;
        let failed = false;
        up.on("data", (bytes: Buffer) => {
          received = true;
          if (call.cancelled) return;
          const event = asSubscribeResponse(bytes);
          if (event && !call.write(event as never)) {
            up.pause();
            call.once("drain", () => up.resume());
          }
        });
        up.on("error", (err) => {
          failed = true;
          if (call.cancelled) return;
          // Before anything was sent, a moved session or a gone runner is retried once.
          if (!received && n === 0 && placements.reroute(who, sessionId, err)) {
            attempt(1).catch((e) => call.emit("error", toStatus(e)));
            return;
          }
          call.emit("error", toStatus(err));
        });
        // grpc-js may end the readable side of a failed call too: only a clean end is one.
        up.on("end", () => failed || call.cancelled || call.end());
        up.write({ frame: { frameId: "subscribe", kind: { case: "open", value: { sessionId, create: false, replayAfterSeq: afterSeq } } } });
      };
      await attempt(0);
    },

    async createSchedule(req, call) {
      if (!req.schedule) throw invalidArgument("schedule is required");
      const schedule = req.schedule;
      const res = await withRunner(call, schedule.sessionId, (runner) => runner.putSchedule({ schedule }, { metadata: onBehalfOf(call) }));
      return { schedule: res.schedule };
    },

    async listSchedules(req, call) {
      const res = await withRunner(call, req.sessionId, (runner) => runner.readSchedules({ sessionId: req.sessionId }, { metadata: onBehalfOf(call) }));
      return { schedules: res.schedules };
    },

    async deleteSchedule(req, call) {
      const res = await withRunner(call, req.sessionId, (runner) => runner.removeSchedule({ sessionId: req.sessionId, scheduleId: req.scheduleId }, { metadata: onBehalfOf(call) }));
      return { deleted: res.deleted };
    },

    async getHistory(req, call) {
      const page = await withRunner(call, req.sessionId, (runner) => runner.readHistory({ sessionId: req.sessionId, pageSize: req.pageSize, pageToken: req.pageToken }, { metadata: onBehalfOf(call) }));
      return { messages: page.messages, nextPageToken: page.nextPageToken };
    },

    async deliver(req, call) {
      // Only an adapter key speaks for channel senders, and only for its own channels.
      const key = callerOf(call.metadata);
      if (key.role !== "adapter") throw permissionDenied(`Deliver needs an adapter key (troupe keys create --role adapter --channel NAME); this key's role is ${key.role}`);
      const inbound = normaliseInbound(req.message);
      if (!key.channels.includes(inbound.context.channel)) throw permissionDenied(`this adapter key speaks for ${key.channels.join(", ")}, not for channel ${inbound.context.channel}`);
      const route = await router.resolveInbound({ context: inbound.context }, { metadata: identityMetadata(key) });
      const sessionId = route.sessionKey;
      const prompt = create(ClientFrameSchema, { frameId: inbound.frameId, kind: { case: "prompt", value: { text: inbound.body, queueMode: req.queueMode } } });
      // Commands from the channel act only when the adapter says the sender may use them.
      const frame = inbound.commandAuthorized ? catchStopCommand(prompt) : prompt;
      admit(identityOf(call.metadata).tenant, sessionId, frame);
      const caller = onBehalfOf(call);
      const accepted = await withRunner(call, sessionId, async (runner) => {
        try {
          return (await runner.submit({ sessionId, frame }, { metadata: caller })).accepted;
        } catch (err) {
          if (grpcCode(err) !== Status.NOT_FOUND) throw err;
          // The first message of this session key: make the session, for the routed agent.
          // Its runs recall the sender's memories (one person across channels, after identity links).
          await runner.ensureSession({ open: { sessionId, agentId: route.agentId, create: true, queueMode: req.queueMode }, memoryOwner: memoryOwnerOf(route.canonicalSender) }, { metadata: caller });
          return (await runner.submit({ sessionId, frame }, { metadata: caller })).accepted;
        }
      });
      return { sessionId, agentId: route.agentId, matchedTier: route.matchedTier, accepted };
    },

    async listSessions(req, call) {
      const caller = onBehalfOf(call);
      invalidArgumentIf(req.pageSize < 0 || req.pageSize > 1000, "page_size must be between 0 and 1000");
      invalidArgumentIf(req.pageToken !== "" && !/^\d{1,9}$/.test(req.pageToken), "page_token is not one this service issued");
      const { runners: live } = await router.listRunners({});
      if (live.length === 0) throw unavailable("no runner is registered");
      // Every runner lists what its store holds; a shared store shows a session more than once.
      const all = new Map<string, SessionInfo>();
      for (const r of live) {
        let token = "";
        do {
          const page = await runners.get(r.address).listStoredSessions({ pageSize: 1000, pageToken: token }, { metadata: caller });
          for (const s of page.sessions) if (!all.has(s.sessionId) || s.running) all.set(s.sessionId, s);
          token = page.nextPageToken;
        } while (token !== "");
      }
      const sorted = [...all.values()].sort((a, b) => a.sessionId.localeCompare(b.sessionId));
      const size = req.pageSize || 100;
      const offset = req.pageToken ? Number(req.pageToken) : 0;
      return { sessions: sorted.slice(offset, offset + size), nextPageToken: offset + size < sorted.length ? String(offset + size) : "" };
    },
  });

  // Reflection lets any gRPC tool discover the public API (grpcurl list, describe); it is open to
  // all, like health: the schema is public, what it reaches is not.
  server.add(ServerReflection, reflectionService([GatewayService, Health]));

  const port = await server.listen(cfg.addr.gateway);
  logger.info(`gateway serving on port ${port}`, { maxMessageBytes: cfg.maxMessageBytes });
  return {
    async drain() {
      await server.drain(cfg.drainGraceMs);
      keys.stop();
      limits.stop();
      quotas.stop();
      runners.close();
      router.close();
    },
  };
}

