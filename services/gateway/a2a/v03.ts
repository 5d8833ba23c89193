// A2A 0.3's JSON-RPC methods (message/send, message/stream, tasks/get, tasks/cancel,
// tasks/resubscribe), which agents built before 1.0 speak, on the same endpoint as 1.0's: the
// method names differ, so one URL serves both. Their requests and results are translated to and
// from the 1.0 messages the core takes (a2a-core.ts); the shapes are 0.3's JSON
// (https://a2a-protocol.org/v0.3.0/specification/): `kind` on every object, lower-case roles and
// states, file parts as {file: {uri | bytes, mimeType, name}}, status updates with `final`.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  type Artifact,
  type Message,
  type Part,
  type PartSchema,
  Role,
  SendMessageRequestSchema,
  type SendMessageRequest,
  type StreamResponse,
  type Task,
  TaskState,
  type TaskStatus,
} from "../../shared/gen/lf/a2a/v1/a2a_pb.js";
import { invalidParams } from "./a2a-core.js";
import { isTerminal } from "./task-fold.js";

/** 0.3's method names, and the 1.0 method each is. */
export const V03_METHODS: Record<string, string> = {
  "message/send": "SendMessage",
  "message/stream": "SendStreamingMessage",
  "tasks/get": "GetTask",
  "tasks/cancel": "CancelTask",
  "tasks/resubscribe": "SubscribeToTask",
};

type Json = Record<string, unknown>;

const STATES: Record<number, string> = {
  [TaskState.UNSPECIFIED]: "unknown",
  [TaskState.SUBMITTED]: "submitted",
  [TaskState.WORKING]: "working",
  [TaskState.COMPLETED]: "completed",
  [TaskState.FAILED]: "failed",
  [TaskState.CANCELED]: "canceled",
  [TaskState.INPUT_REQUIRED]: "input-required",
  [TaskState.REJECTED]: "rejected",
  [TaskState.AUTH_REQUIRED]: "auth-required",
};

const object = (v: unknown, what: string): Json => {
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw invalidParams(`${what} must be an object`);
  return v as Json;
};

function partIn(v: unknown, i: number): MessageInitShape<typeof PartSchema> {
  const p = object(v, `message.parts[${i}]`);
  if (p.kind === "text" && typeof p.text === "string") return { content: { case: "text", value: p.text } };
  if (p.kind === "data") return { content: { case: "data", value: p.data as never } };
  if (p.kind === "file") {
    const f = object(p.file, `message.parts[${i}].file`);
    const mediaType = typeof f.mimeType === "string" ? f.mimeType : "";
    const filename = typeof f.name === "string" ? f.name : "";
    if (typeof f.uri === "string") return { content: { case: "url", value: f.uri }, mediaType, filename };
    if (typeof f.bytes === "string")
      return { content: { case: "raw", value: Buffer.from(f.bytes, "base64") }, mediaType, filename };
  }
  throw invalidParams(
    `message.parts[${i}]: a part is {kind: "text", text}, {kind: "file", file} or {kind: "data", data}`,
  );
}

/** A 0.3 message/send or message/stream's params as 1.0's SendMessageRequest. */
export function sendRequestIn(params: unknown): SendMessageRequest {
  const p = object(params ?? {}, "params");
  const m = object(p.message, "params.message");
  if (m.role !== "user") throw invalidParams('message.role must be "user"');
  if (!Array.isArray(m.parts)) throw invalidParams("message.parts must be an array");
  const config = p.configuration === undefined ? {} : object(p.configuration, "params.configuration");
  const str = (v: unknown) => (typeof v === "string" ? v : "");
  return create(SendMessageRequestSchema, {
    message: {
      messageId: str(m.messageId),
      contextId: str(m.contextId),
      taskId: str(m.taskId),
      role: Role.USER,
      parts: m.parts.map(partIn),
    },
    configuration: {
      acceptedOutputModes: Array.isArray(config.acceptedOutputModes) ? config.acceptedOutputModes.map(String) : [],
      historyLength: typeof config.historyLength === "number" ? config.historyLength : undefined,
      // 0.3's blocking: false is 1.0's return_immediately; a send blocks unless told not to.
      returnImmediately: config.blocking === false,
      // Any push config: the core refuses it as it refuses 1.0's (push notifications are not sent).
      taskPushNotificationConfig: config.pushNotificationConfig
        ? { url: String(object(config.pushNotificationConfig, "pushNotificationConfig").url) }
        : undefined,
    },
  });
}

/** tasks/get's, tasks/cancel's and tasks/resubscribe's params: the task's id (and history length). */
export function taskParamsIn(params: unknown): { id: string; historyLength?: number } {
  const p = object(params ?? {}, "params");
  if (typeof p.id !== "string" || p.id === "") throw invalidParams("params.id is required");
  return { id: p.id, historyLength: typeof p.historyLength === "number" ? p.historyLength : undefined };
}

function partOut(p: Part): Json {
  const c = p.content;
  if (c.case === "text") return { kind: "text", text: c.value };
  if (c.case === "data") return { kind: "data", data: c.value };
  const file: Json = c.case === "url" ? { uri: c.value } : { bytes: Buffer.from(c.value ?? []).toString("base64") };
  if (p.mediaType) file.mimeType = p.mediaType;
  if (p.filename) file.name = p.filename;
  return { kind: "file", file };
}

function messageOut(m: Message): Json {
  const out: Json = {
    kind: "message",
    messageId: m.messageId,
    role: m.role === Role.USER ? "user" : "agent",
    parts: m.parts.map(partOut),
  };
  if (m.contextId) out.contextId = m.contextId;
  if (m.taskId) out.taskId = m.taskId;
  return out;
}

function statusOut(s: TaskStatus | undefined): Json {
  const out: Json = { state: STATES[s?.state ?? TaskState.UNSPECIFIED] ?? "unknown" };
  if (s?.message) out.message = messageOut(s.message);
  if (s?.timestamp) out.timestamp = timestampDate(s.timestamp).toISOString();
  return out;
}

const artifactOut = (a: Artifact): Json => ({ artifactId: a.artifactId, name: a.name, parts: a.parts.map(partOut) });

export function taskOut(t: Task): Json {
  return {
    kind: "task",
    id: t.id,
    contextId: t.contextId,
    status: statusOut(t.status),
    artifacts: t.artifacts.map(artifactOut),
    history: t.history.map(messageOut),
  };
}

export function streamOut(u: StreamResponse): Json {
  const p = u.payload;
  switch (p.case) {
    case "task":
      return taskOut(p.value);
    case "message":
      return messageOut(p.value);
    case "statusUpdate":
      return {
        kind: "status-update",
        taskId: p.value.taskId,
        contextId: p.value.contextId,
        status: statusOut(p.value.status),
        final: isTerminal(p.value.status?.state ?? TaskState.UNSPECIFIED),
      };
    case "artifactUpdate":
      return {
        kind: "artifact-update",
        taskId: p.value.taskId,
        contextId: p.value.contextId,
        artifact: artifactOut(p.value.artifact!),
        append: p.value.append,
        lastChunk: p.value.lastChunk,
      };
    default:
      return {};
  }
}
