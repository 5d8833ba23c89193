// A2A's operations on Troupe's sessions and runs, for both bindings (jsonrpc.ts on the HTTP
// edge, grpc-binding.ts on the gateway's gRPC port). Every step is a gateway call with the
// caller's own key, so keys, tenancy, limits and quotas are those of every other route.
//
// What maps to what:
//   - a context is a session of the caller's: a message without context_id starts a new one
//     (`a2a-<uuid>`); one with it continues that session (made when the caller has none of that
//     id). A task is one run: its id names the session, where the run starts and its prompt
//     (run-events.ts RunRef, prefix `task-`), so any gateway reads it back from the session's log;
//   - the message's text parts are the prompt; image parts (a URL fetched through the SSRF guard,
//     or raw bytes with an image media type) go to vision models; a data part is given as JSON;
//     other files are ContentTypeNotSupported;
//   - the task's artifact `reply` holds the agent's reply; its history, the prompt and the
//     agent's messages; its state, submitted, working, then completed, failed or canceled;
//   - message_id makes a send idempotent: the same message again answers with the same task.
// Not offered: push notifications (refused), a message naming a task_id (Troupe's runs do not
// wait for input: continue in the context instead), ListTasks.
import { createHash, randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import type { NetPolicy } from "../../shared/net/net-guard.js";
import { RpcError, Status, grpcCode } from "../../shared/errors.js";
import { DEFAULT_AGENT, isAgentId } from "../../shared/ids.js";
import {
  type CancelTaskRequest,
  type GetTaskRequest,
  type Message,
  MessageSchema,
  Role,
  type SendMessageRequest,
  type SendMessageResponse,
  SendMessageResponseSchema,
  type StreamResponse,
  type SubscribeToTaskRequest,
  type Task,
} from "../../shared/gen/lf/a2a/v1/a2a_pb.js";
import type { GatewayClient } from "../http/edge.js";
import type { forwardedMetadata } from "../http/metadata.js";
import { requestConversation } from "../http/openai-history.js";
import { ApiError } from "../http/openai-request.js";
import { conversationRuns } from "../http/openai-session.js";
import { listAgents } from "../http/agent-list.js";
import {
  cancelOnceStarted,
  joinsOf,
  type RunRef,
  runEvents,
  runIdOf,
  runRefOf,
  runSnapshot,
} from "../http/run-events.js";
import { TaskFold } from "./task-fold.js";

type Metadata = ReturnType<typeof forwardedMetadata>;

export const TASK_PREFIX = "task-";
const CONTEXT_PREFIX = "a2a-";
/** A task this long without its end is given up on by a blocking send (the run goes on). */
const RUN_TIMEOUT_MS = 15 * 60_000;
const CANCEL_WAIT_MS = 10_000;
/** The domain of A2A's ErrorInfo reasons. */
const A2A_DOMAIN = "a2a-protocol.org";

/** An A2A error: its gRPC status and ErrorInfo reason, and its JSON-RPC code. */
export class A2aError extends RpcError {
  constructor(
    code: Status,
    private readonly why: string,
    readonly jsonRpcCode: number,
    message: string,
  ) {
    super(code, message);
  }
  override get reason(): string {
    return this.why;
  }
  override get domain(): string {
    return A2A_DOMAIN;
  }
}

export const invalidParams = (message: string) =>
  new A2aError(Status.INVALID_ARGUMENT, "INVALID_PARAMS", -32602, message);
const taskNotFound = (id: string) =>
  new A2aError(Status.NOT_FOUND, "TASK_NOT_FOUND", -32001, `task ${JSON.stringify(id.slice(0, 200))} not found`);
const unsupported = (message: string) => new A2aError(Status.UNIMPLEMENTED, "UNSUPPORTED_OPERATION", -32004, message);
const contentType = (message: string) =>
  new A2aError(Status.INVALID_ARGUMENT, "CONTENT_TYPE_NOT_SUPPORTED", -32005, message);

/** Any failure as an A2A error; a gateway status keeps its code. */
export function a2aErrorOf(err: unknown): A2aError {
  if (err instanceof A2aError) return err;
  if (err instanceof ApiError)
    return new A2aError(
      err.status === 400 ? Status.INVALID_ARGUMENT : err.status === 404 ? Status.NOT_FOUND : Status.UNAVAILABLE,
      err.status === 400 ? "INVALID_PARAMS" : "INTERNAL_ERROR",
      err.status === 400 ? -32602 : -32603,
      err.message,
    );
  const code = grpcCode(err) ?? Status.INTERNAL;
  const message = (err as { details?: string }).details || (err as Error).message || "internal error";
  return code === Status.INVALID_ARGUMENT
    ? invalidParams(message)
    : new A2aError(code, "INTERNAL_ERROR", -32603, message);
}

/** `client`: the gateway's own API (its loopback, opened once the gateway serves). */
export function a2aCore(client: () => GatewayClient, opts: { agentsDir: string; net: NetPolicy }) {
  // Made on first use: the loopback client exists only once the gateway serves.
  let runs: ReturnType<typeof conversationRuns> | undefined;
  const ask: ReturnType<typeof conversationRuns>["ask"] = (...a) => (runs ??= conversationRuns(client())).ask(...a);

  /** The agent an endpoint or a request's tenant names; empty: the default agent. */
  const agentOf = async (name: string) => {
    const agent = name === "" ? DEFAULT_AGENT : name;
    if (!isAgentId(agent) || !(await listAgents(opts.agentsDir)).includes(agent))
      throw invalidParams(`there is no agent ${JSON.stringify(name.slice(0, 100))}`);
    return agent;
  };

  /** The message's parts as a prompt: text, and images for a vision model. */
  const promptOf = async (m: Message) => {
    const content: unknown[] = [];
    for (const [i, part] of m.parts.entries()) {
      const c = part.content;
      const type = part.mediaType.toLowerCase();
      if (c.case === "text") content.push({ type: "text", text: c.value });
      else if (c.case === "data") content.push({ type: "text", text: JSON.stringify(c.value) });
      else if ((c.case === "url" || c.case === "raw") && (type === "" || type.startsWith("image/"))) {
        if (c.case === "raw" && type === "") throw contentType(`parts[${i}]: raw bytes need their media_type`);
        const url = c.case === "url" ? c.value : `data:${type};base64,${Buffer.from(c.value).toString("base64")}`;
        content.push({ type: "image_url", image_url: { url } });
      } else if (c.case === undefined) throw invalidParams(`parts[${i}] is empty`);
      else throw contentType(`parts[${i}]: ${type || c.case} is not taken: text, data and images are`);
    }
    return requestConversation([{ role: "user", content }], opts.net);
  };

  /** Checks a send; puts its message in its context; the task it started and the fold for it. */
  const start = async (req: SendMessageRequest, endpointAgent: string, metadata: Metadata) => {
    const m = req.message;
    if (!m) throw invalidParams("`message` is required");
    if (m.messageId === "") throw invalidParams("`message.messageId` is required");
    if (m.role !== Role.USER) throw invalidParams("`message.role` must be ROLE_USER");
    if (m.parts.length === 0) throw invalidParams("`message.parts` is empty");
    if (m.taskId !== "")
      throw unsupported(
        "a message naming a task_id: Troupe's tasks do not wait for input; send the message in the task's context_id instead",
      );
    const config = req.configuration;
    if (config?.taskPushNotificationConfig)
      throw new A2aError(
        Status.UNIMPLEMENTED,
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
        -32003,
        "push notifications are not sent",
      );
    const modes = config?.acceptedOutputModes ?? [];
    if (modes.length > 0 && !modes.some((x) => x === "text/plain" || x === "text/*" || x === "*/*"))
      throw contentType("the agent answers in text/plain, which accepted_output_modes leaves out");
    const agentId = await agentOf(req.tenant || endpointAgent);
    const conversation = await promptOf(m).catch((err) => {
      throw err instanceof ApiError ? invalidParams(err.message) : err;
    });
    const frameId = createHash("sha256").update(m.messageId).digest("hex").slice(0, 32);
    const asked = await ask(
      m.contextId,
      CONTEXT_PREFIX,
      agentId,
      { ...conversation, sampling: {} },
      [],
      frameId,
      metadata,
    );
    const ref: RunRef = { sessionId: asked.session, afterSeq: asked.afterSeq - 1n, kind: "p", frameId };
    if (asked.duplicate) {
      // Sent before: the task is the one that first send started, under the same id.
      const first = await runSnapshot(client(), { ...ref, afterSeq: 0n }, metadata);
      ref.afterSeq = first.acceptedSeq - 1n;
    }
    const prompt = create(MessageSchema, { ...m, contextId: asked.session, taskId: runIdOf(TASK_PREFIX, ref) });
    return { ref, fold: new TaskFold(prompt.taskId, asked.session, prompt), history: config?.historyLength };
  };

  /** Follows a task's run through `fold`, yielding its updates after `from` events. */
  async function* follow(ref: RunRef, fold: TaskFold, metadata: Metadata, signal: AbortSignal, skip = 0) {
    let seen = 0;
    for await (const event of runEvents(client(), {
      sessionId: ref.sessionId,
      afterSeq: ref.afterSeq,
      frameId: ref.frameId,
      joins: joinsOf(ref),
      metadata,
      signal,
    })) {
      const updates = fold.take(event);
      if (seen++ >= skip) yield* updates;
      if (fold.done) return;
    }
  }

  /** The task an id names, as it stands now, read from its session. */
  const current = async (id: string, metadata: Metadata) => {
    const ref = runRefOf(TASK_PREFIX, id);
    if (!ref) throw taskNotFound(id);
    const run = await runSnapshot(client(), ref, metadata).catch((err) => {
      throw grpcCode(err) === Status.NOT_FOUND ? taskNotFound(id) : err;
    });
    if (!run.accepted) throw taskNotFound(id);
    const fold = new TaskFold(id, ref.sessionId);
    for (const e of run.events) fold.take(e);
    return { ref, fold, taken: run.events.length };
  };

  /** The task with at most `n` history messages (the latest), as history_length asks. */
  const limited = (task: Task, n: number | undefined): Task =>
    n === undefined || n >= task.history.length ? task : { ...task, history: n <= 0 ? [] : task.history.slice(-n) };

  const withTimeout = () => {
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), RUN_TIMEOUT_MS);
    return { signal: stop.signal, abort: () => stop.abort(), clear: () => clearTimeout(timer) };
  };

  return {
    agentOf,

    async sendMessage(req: SendMessageRequest, agent: string, metadata: Metadata): Promise<SendMessageResponse> {
      const { ref, fold, history } = await start(req, agent, metadata);
      if (!req.configuration?.returnImmediately) {
        const t = withTimeout();
        try {
          for await (const _ of follow(ref, fold, metadata, t.signal));
        } finally {
          t.clear();
        }
      }
      return create(SendMessageResponseSchema, { payload: { case: "task", value: limited(fold.task, history) } });
    },

    async *sendStreamingMessage(
      req: SendMessageRequest,
      agent: string,
      metadata: Metadata,
      signal: AbortSignal,
    ): AsyncGenerator<StreamResponse> {
      const { ref, fold } = await start(req, agent, metadata);
      yield fold.snapshot();
      yield* follow(ref, fold, metadata, signal);
    },

    async getTask(req: GetTaskRequest, metadata: Metadata): Promise<Task> {
      const { fold } = await current(req.id, metadata);
      return limited(fold.task, req.historyLength);
    },

    async cancelTask(req: CancelTaskRequest, metadata: Metadata): Promise<Task> {
      const { last, aborted } = await cancelOnceStarted(
        () => current(req.id, metadata),
        {
          started: (now) => now.taken > 0,
          done: (now) => now.fold.done,
          abort: (now) =>
            client().abort(
              { sessionId: now.ref.sessionId, frameId: randomUUID(), reason: "the A2A task was canceled" },
              { metadata },
            ),
        },
        CANCEL_WAIT_MS,
      );
      if (last.fold.done && !aborted)
        throw new A2aError(
          Status.FAILED_PRECONDITION,
          "TASK_NOT_CANCELABLE",
          -32002,
          `task ${req.id.slice(0, 200)} has ended: it cannot be canceled`,
        );
      return last.fold.task;
    },

    async *subscribeToTask(
      req: SubscribeToTaskRequest,
      metadata: Metadata,
      signal: AbortSignal,
    ): AsyncGenerator<StreamResponse> {
      const now = await current(req.id, metadata);
      if (now.fold.done) throw unsupported(`task ${req.id.slice(0, 200)} has ended: read it with GetTask`);
      yield now.fold.snapshot();
      // The run from its start, its updates passed on from where the snapshot stood.
      yield* follow(now.ref, new TaskFold(req.id, now.ref.sessionId), metadata, signal, now.taken);
    },
  };
}

export type A2aCore = ReturnType<typeof a2aCore>;
