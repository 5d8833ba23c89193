// The in-process test tier's parts: a session actor over the in-memory store, with a model client
// that plays a script (chunks per call, as pi's agent tests do with their mock stream), and a
// subscriber that collects events. No ports, no child processes, no Docker.
import { mkdtempSync } from "node:fs";
import assert from "node:assert/strict";
import { after } from "node:test";
import { UNEXPECTED } from "../../services/runner/session/lifecycle.js";
import os from "node:os";
import path from "node:path";
import type { AgentEvent, ClientFrame } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { ClientFrameSchema } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { RpcError } from "../../services/shared/errors.js";
import type { Logger } from "../../services/shared/process/log.js";
import { DEFAULT_AGENT, type AgentConfig } from "../../services/runner/agent-config.js";
import { AuditLog } from "../../services/runner/store/audit-log.js";
import { Hooks } from "../../services/runner/loop/hooks.js";
import { InMemorySessionStore } from "../../services/runner/store/in-memory-store.js";
import type { RunDeps } from "../../services/runner/loop/run.js";
import {
  ModelError,
  type ModelChunk,
  type ModelClient,
  type ModelRequest,
} from "../../services/runner/providers/model.js";
import type { EventSubscriber } from "../../services/runner/session/event-journal.js";
import { SessionActor, type ActorDeps } from "../../services/runner/session/session-actor.js";
import { TokenCounter } from "../../services/runner/loop/tokens.js";
import type { Tool } from "../../services/runner/tools/tools.js";

/** One model call's answer: its chunks (streamed `gapMs` apart), or an error thrown at the start. */
export type Reply = { chunks: ModelChunk[]; gapMs?: number } | ModelError;

const done = (finishReason: "stop" | "tool_calls" | "length"): ModelChunk => ({
  type: "done",
  finishReason,
  rawFinishReason: finishReason,
  responseModel: "test-model",
  responseId: "r",
});

/** A reply of plain text, a word per chunk. */
export function say(text: string, gapMs = 0): Reply {
  const words = text.split(" ");
  return {
    chunks: [...words.map((w, i): ModelChunk => ({ type: "text", delta: i === 0 ? w : ` ${w}` })), done("stop")],
    gapMs,
  };
}

/** A reply that calls tools: [name, arguments] each. */
export function call(...calls: [string, Record<string, unknown>][]): Reply {
  return {
    chunks: [
      ...calls.map(
        ([name, args], index): ModelChunk => ({
          type: "tool_call",
          index,
          id: `call-${index}-${name}`,
          name,
          argumentsDelta: JSON.stringify(args),
        }),
      ),
      done("tool_calls"),
    ],
  };
}

/** A model client that answers call n with script(request, n). */
export class ScriptedModel implements ModelClient {
  providerOf(): string {
    return "scripted";
  }
  readonly requests: ModelRequest[] = [];
  constructor(private readonly script: (request: ModelRequest, n: number) => Reply) {}

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    const n = this.requests.push(request) - 1;
    const reply = this.script(request, n);
    if (reply instanceof ModelError) throw reply;
    for (const chunk of reply.chunks) {
      if (reply.gapMs) await new Promise((r) => setTimeout(r, reply.gapMs));
      if (signal.aborted) throw new ModelError("aborted", false, undefined, true);
      yield chunk;
    }
  }

  async close(): Promise<void> {}
}

/** The text of the last user message of a request. */
export const lastUser = (r: ModelRequest): string => {
  const m = [...r.messages].reverse().find((x) => x.role === "user");
  return m && "content" in m ? m.content : "";
};

/** A tool that answers with its arguments after `ms`, recording the calls it ran. */
export function echoTool(name: string, ms = 0, ran: string[] = []): Tool {
  return {
    name,
    description: `echoes (${name})`,
    parameters: { type: "object", properties: { text: { type: "string" } }, additionalProperties: false },
    async execute(args, ctx) {
      ran.push(String(args.text ?? ""));
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, ms);
        ctx.signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
      });
      return { output: `${name}: ${String(args.text ?? "")}`, isError: false };
    },
  };
}

export const quietLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };

/**
 * The actors' logger: quiet, but a happening the session's lifecycle table does not expect
 * (lifecycle.ts) fails the test file that met it.
 */
const surprises: string[] = [];
const actorLogger: Logger = {
  ...quietLogger,
  error(message, fields) {
    if (message === UNEXPECTED) surprises.push(JSON.stringify(fields));
  },
};
after(() => assert.deepEqual(surprises, [], "happenings the session lifecycle does not expect"));

/** What a run needs, with test defaults: no memory, a fixed system prompt, no hooks. */
export function testRunDeps(
  model: ModelClient,
  tools: Tool[] = [],
  over: Partial<RunDeps> & { config?: Partial<AgentConfig> } = {},
): RunDeps {
  const { config: settings, ...rest } = over;
  const counter = TokenCounter.forModel("test-model");
  const config: AgentConfig = {
    name: "main",
    ...DEFAULT_AGENT,
    retry: { maxRetries: 2, baseDelayMs: 1, maxDelayMs: 50 },
    ...settings,
  };
  return {
    agentId: "main",
    tenant: "t",
    principal: "alice",
    log: quietLogger,
    triggerOrigin: async () => "",
    defaultModel: "test-model",
    model,
    tools,
    hooks: new Hooks(),
    sender: "alice",
    agent: async () => ({ config }),
    tokens: async () => counter,
    systemPrompt: async () => ({ text: "You are a test agent.", tokens: 6, warnings: [] }),
    ...rest,
  };
}

type PayloadOf<K> = Extract<AgentEvent["payload"], { case: K }> extends { value: infer V } ? V : never;

/** Collects every event a session sends, and can wait for one. */
export class Collector implements EventSubscriber {
  readonly events: AgentEvent[] = [];
  private waiters: { test: (e: AgentEvent) => boolean; resolve: (e: AgentEvent) => void }[] = [];
  closedWith?: RpcError;

  send(event: AgentEvent): void {
    this.events.push(event);
    for (const w of [...this.waiters]) {
      if (w.test(event)) {
        this.waiters.splice(this.waiters.indexOf(w), 1);
        w.resolve(event);
      }
    }
  }

  pressure(): undefined {
    return undefined;
  }

  close(err: RpcError): void {
    this.closedWith = err;
  }

  /** The first event from index `from` on that passes `test` (waiting for it). */
  waitFor(test: (e: AgentEvent) => boolean, from = 0, timeoutMs = 5000): Promise<AgentEvent> {
    const found = this.events.slice(from).find(test);
    if (found) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () =>
          reject(
            new Error(`no such event within ${timeoutMs} ms; saw ${this.events.map((e) => e.payload.case).join(",")}`),
          ),
        timeoutMs,
      );
      this.waiters.push({ test, resolve: (e) => (clearTimeout(timer), resolve(e)) });
    });
  }

  of<K extends NonNullable<AgentEvent["payload"]["case"]>>(kind: K): PayloadOf<K>[] {
    return this.events.filter((e) => e.payload.case === kind).map((e) => e.payload.value) as unknown as PayloadOf<K>[];
  }
}

let frames = 0;
/** A client frame with a fresh id unless one is given. */
export function frame(kind: MessageInitShape<typeof ClientFrameSchema>["kind"], frameId = `f${++frames}`): ClientFrame {
  return create(ClientFrameSchema, { frameId, kind });
}
export const prompt = (text: string, frameId?: string, queueMode?: number) =>
  frame({ case: "prompt", value: { text, queueMode } }, frameId);

/** An actor of a new session over `store`, with a collector attached. */
export async function newActor(
  runDeps: ActorDeps["runDeps"],
  opts: { store?: InMemorySessionStore; deps?: Partial<ActorDeps>; sessionId?: string } = {},
) {
  const store = opts.store ?? new InMemorySessionStore();
  const deps: ActorDeps = {
    store,
    audit: new AuditLog(mkdtempSync(path.join(os.tmpdir(), "troupe-unit-audit-"))),
    logger: actorLogger,
    runDeps,
    ...opts.deps,
  };
  const actor = await SessionActor.create(opts.sessionId ?? "s1", "main", { tenant: "t", principal: "alice" }, deps);
  const events = new Collector();
  await actor.attach(events);
  return { actor, events, store, deps };
}
