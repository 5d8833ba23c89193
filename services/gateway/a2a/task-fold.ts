// A run's events as an A2A task (proto/lf/a2a/v1/a2a.proto): its state, its history (the user's
// prompt and the agent's messages) and one artifact, the reply, and the stream updates that build
// them: the task first, then `working`, the reply's text in chunks (append, then last_chunk),
// and the final status. SendMessage, GetTask, CancelTask and both streams read a run through
// this one fold, so they agree.
//
// Plain data: take() returns the updates an AgentEvent makes and updates `task`.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { type Timestamp, timestampFromMs } from "@bufbuild/protobuf/wkt";
import {
  ArtifactSchema,
  type Message,
  MessageSchema,
  Role as A2aRole,
  type StreamResponse,
  StreamResponseSchema,
  type Task,
  TaskSchema,
  TaskState,
  TaskStatusSchema,
} from "../../shared/gen/lf/a2a/v1/a2a_pb.js";
import { Role, StopReason, type AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { StreamedText } from "../../shared/streamed-text.js";

type Update = MessageInitShape<typeof StreamResponseSchema>["payload"];

const TERMINAL = new Set([TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED]);
export const isTerminal = (s: TaskState): boolean => TERMINAL.has(s);

/** The reply artifact's id: one per task. */
const REPLY = "reply";

export class TaskFold {
  readonly task: Task;
  private readonly passed = new StreamedText();
  /** Whether the reply artifact has had a chunk (later ones append). */
  private replied = false;
  /** Assistant messages written so far (the reply separates them with a blank line). */
  private messages = 0;
  /** When the event being taken happened (a status change's timestamp). */
  private at: Timestamp | undefined;

  constructor(id: string, contextId: string, prompt?: Message) {
    this.task = create(TaskSchema, {
      id,
      contextId,
      status: { state: TaskState.SUBMITTED, timestamp: timestampFromMs(Date.now()) },
      history: prompt ? [prompt] : [],
    });
  }

  get state(): TaskState {
    return this.task.status!.state;
  }

  get done(): boolean {
    return isTerminal(this.state);
  }

  /** The task as it stands, as the first update of a stream. */
  snapshot(): StreamResponse {
    return create(StreamResponseSchema, { payload: { case: "task", value: this.task } });
  }

  take(e: AgentEvent): StreamResponse[] {
    const out: Update[] = [];
    const p = e.payload;
    if (this.done) return [];
    this.at = e.time;
    if (p.case === "agentStart") this.status(TaskState.WORKING, out);
    else if (p.case === "gap") this.passed.gap(e.seq);
    else if (p.case === "messageStart" && p.value.message?.role === Role.ASSISTANT) {
      this.passed.start(p.value.message.id, e.seq);
      if (this.messages++ > 0) this.chunk("\n\n", out);
    } else if (p.case === "messageUpdate" && p.value.delta.case === "text")
      this.chunk(this.passed.delta(p.value.messageId, p.value.delta.value), out);
    else if (p.case === "messageEnd" && p.value.message) {
      const m = p.value.message;
      if (m.role === Role.ASSISTANT) {
        this.chunk(this.passed.end(m.id, m.text), out);
        if (m.text !== "") this.task.history.push(agentMessage(m.id, m.text, this.task));
      } else if (m.role === Role.USER && !this.task.history.some((h) => h.role === A2aRole.USER))
        this.task.history.unshift(
          create(MessageSchema, {
            messageId: m.id,
            contextId: this.task.contextId,
            taskId: this.task.id,
            role: A2aRole.USER,
            parts: [{ content: { case: "text", value: m.text } }],
          }),
        );
    } else if (p.case === "runResumed") {
      // A restart cut a message; the run asks for it again, and the reply goes on after it.
      if (this.passed.resumed().length > 0) this.chunk("\n\n", out);
    } else if (p.case === "agentEnd") {
      if (this.replied) {
        const artifact = create(ArtifactSchema, {
          artifactId: REPLY,
          parts: [{ content: { case: "text", value: "" } }],
        });
        out.push({
          case: "artifactUpdate",
          value: { taskId: this.task.id, contextId: this.task.contextId, artifact, append: true, lastChunk: true },
        });
      }
      const v = p.value;
      if (v.stopReason === StopReason.ERROR)
        this.status(
          TaskState.FAILED,
          out,
          agentMessage(`${this.task.id}-error`, v.errorMessage || "the agent's run failed", this.task),
        );
      else if (v.stopReason === StopReason.ABORTED) this.status(TaskState.CANCELED, out);
      else this.status(TaskState.COMPLETED, out);
    }
    return out.map((payload) => create(StreamResponseSchema, { payload }));
  }

  private chunk(text: string, out: Update[]): void {
    if (text === "") return;
    let artifact = this.task.artifacts[0];
    if (!artifact) {
      artifact = create(ArtifactSchema, {
        artifactId: REPLY,
        name: "reply",
        parts: [{ content: { case: "text", value: "" } }],
      });
      this.task.artifacts.push(artifact);
    }
    const part = artifact.parts[0];
    if (part.content.case === "text") part.content.value += text;
    const chunk = create(ArtifactSchema, {
      artifactId: REPLY,
      name: "reply",
      parts: [{ content: { case: "text", value: text } }],
    });
    out.push({
      case: "artifactUpdate",
      value: {
        taskId: this.task.id,
        contextId: this.task.contextId,
        artifact: chunk,
        append: this.replied,
        lastChunk: false,
      },
    });
    this.replied = true;
  }

  private status(state: TaskState, out: Update[], message?: Message): void {
    this.task.status = create(TaskStatusSchema, { state, message, timestamp: this.at ?? timestampFromMs(Date.now()) });
    out.push({
      case: "statusUpdate",
      value: { taskId: this.task.id, contextId: this.task.contextId, status: this.task.status },
    });
  }
}

function agentMessage(id: string, text: string, task: Task): Message {
  return create(MessageSchema, {
    messageId: id,
    contextId: task.contextId,
    taskId: task.id,
    role: A2aRole.AGENT,
    parts: [{ content: { case: "text", value: text } }],
  });
}
