// A run's events as a Responses API response: the response object, and the streaming events that
// build it, as OpenAI's API reference defines them
// (https://platform.openai.com/docs/api-reference/responses-streaming): response.created and
// .in_progress; per assistant message output_item.added, content_part.added,
// output_text.delta..., output_text.done, content_part.done, output_item.done; per client call
// output_item.added, function_call_arguments.delta..., .done, output_item.done; then
// response.completed, .incomplete or .failed. POST, GET and their streamed forms all read a run
// through this one fold, so what a stream showed and what GET returns are the same.
//
// Plain data: take() returns the events an AgentEvent makes and updates `response`; nothing here
// writes or calls out.
import { Role, StopReason, type AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { StreamedText } from "../../shared/streamed-text.js";
import { callIdFor } from "./openai-tools.js";

/** A call's arguments go out in pieces of this many characters, as deltas. */
const ARGUMENT_PIECE = 256;

export type ResponseStatus = "queued" | "in_progress" | "completed" | "failed" | "cancelled" | "incomplete";

interface MessageItem {
  type: "message";
  id: string;
  status: "in_progress" | "completed" | "incomplete";
  role: "assistant";
  content: { type: "output_text"; text: string; annotations: never[]; logprobs: never[] }[];
}

interface CallItem {
  type: "function_call";
  id: string;
  call_id: string;
  name: string;
  arguments: string;
  status: "in_progress" | "completed";
}

export interface ResponseObject {
  id: string;
  object: "response";
  created_at: number;
  status: ResponseStatus;
  background: boolean;
  error: { code: string; message: string } | null;
  incomplete_details: { reason: string } | null;
  instructions: string | null;
  max_output_tokens: number | null;
  model: string;
  output: (MessageItem | CallItem)[];
  parallel_tool_calls: boolean;
  previous_response_id: string | null;
  reasoning: { effort: null; summary: null };
  store: boolean;
  temperature: number | null;
  text: { format: { type: "text" } };
  tool_choice: "auto" | "none";
  tools: unknown[];
  top_p: number;
  truncation: "disabled";
  usage: {
    input_tokens: number;
    input_tokens_details: { cached_tokens: number };
    output_tokens: number;
    output_tokens_details: { reasoning_tokens: number };
    total_tokens: number;
  } | null;
  user: string | null;
  metadata: Record<string, string>;
}

export type StreamEvent = { type: string; sequence_number: number } & Record<string, unknown>;

/** What a response object starts as; `created_at` in seconds. */
export function newResponse(
  fields: Pick<ResponseObject, "id" | "model" | "background" | "store" | "previous_response_id"> &
    Partial<ResponseObject>,
): ResponseObject {
  return {
    object: "response",
    created_at: Math.floor(Date.now() / 1000),
    status: "in_progress",
    error: null,
    incomplete_details: null,
    instructions: null,
    max_output_tokens: null,
    output: [],
    parallel_tool_calls: true,
    reasoning: { effort: null, summary: null },
    temperature: null,
    text: { format: { type: "text" } },
    tool_choice: "auto",
    tools: [],
    top_p: 1,
    truncation: "disabled",
    usage: null,
    user: null,
    metadata: {},
    ...fields,
  };
}

const TERMINAL = new Set<ResponseStatus>(["completed", "failed", "cancelled", "incomplete"]);
export const isTerminal = (s: ResponseStatus): boolean => TERMINAL.has(s);

const copy = <T>(v: T): T => structuredClone(v);

export class ResponseFold {
  private sequence = 0;
  private readonly passed = new StreamedText();
  /** The message item being written, by message id (opened at its first text). */
  private open: { messageId: string; index: number } | undefined;
  /** Whether the run has been seen to start (before that, a response is queued). */
  private started = false;

  constructor(
    readonly response: ResponseObject,
    private readonly sessionId: string,
  ) {}

  get done(): boolean {
    return isTerminal(this.response.status);
  }

  private event(type: string, fields: Record<string, unknown>): StreamEvent {
    return { type, sequence_number: this.sequence++, ...fields };
  }

  /** The events a stream opens with. */
  opening(): StreamEvent[] {
    const snapshot = copy(this.response);
    return [
      this.event("response.created", { response: snapshot }),
      this.event("response.in_progress", { response: snapshot }),
    ];
  }

  /** The events one of the run's AgentEvents makes (none for most). */
  take(e: AgentEvent): StreamEvent[] {
    const p = e.payload;
    const out: StreamEvent[] = [];
    if (this.done) return out;
    if (p.case === "agentStart" || !this.started) this.started = true;
    if (p.case === "messageStart" && p.value.message?.role === Role.ASSISTANT)
      this.passed.start(p.value.message.id, e.seq);
    else if (p.case === "gap") this.passed.gap(e.seq);
    else if (p.case === "messageUpdate" && p.value.delta.case === "text")
      this.text(p.value.messageId, this.passed.delta(p.value.messageId, p.value.delta.value), out);
    else if (p.case === "messageEnd" && p.value.message?.role === Role.ASSISTANT) {
      const id = p.value.message.id;
      this.text(id, this.passed.end(id, p.value.message.text), out);
      this.close(id, "completed", out);
    } else if (p.case === "runResumed") {
      // A restart cut the message being written: it stays as it was, incomplete, and the run
      // asks for it again as a new one.
      this.passed.resumed();
      if (this.open) this.close(this.open.messageId, "incomplete", out);
    } else if (p.case === "clientToolCall") this.call(p.value.toolCallId, p.value.toolName, p.value.argumentsJson, out);
    else if (p.case === "runWaiting" && this.response.output.some((i) => i.type === "function_call")) {
      // The run waits on the client's calls: for the client this response is complete.
      this.finish("completed", out);
    } else if (p.case === "agentEnd") {
      const u = p.value.usage;
      const input = u?.inputTokens ?? 0;
      const output = u?.outputTokens ?? 0;
      this.response.usage = {
        input_tokens: input,
        input_tokens_details: { cached_tokens: u?.cacheReadInputTokens ?? 0 },
        output_tokens: output,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: input + output,
      };
      if (this.open) this.close(this.open.messageId, "incomplete", out);
      switch (p.value.stopReason) {
        case StopReason.LENGTH:
          this.response.incomplete_details = { reason: "max_output_tokens" };
          this.finish("incomplete", out);
          break;
        case StopReason.ERROR:
          this.response.error = { code: "server_error", message: p.value.errorMessage || "the agent's run failed" };
          this.finish("failed", out);
          break;
        case StopReason.ABORTED:
          this.finish("cancelled", out);
          break;
        default:
          this.finish("completed", out);
      }
    }
    return out;
  }

  /** Where a read of the run stopped before its end: what the response is now. */
  settle(): void {
    if (this.done) return;
    this.response.status = this.started ? "in_progress" : "queued";
  }

  private text(messageId: string, piece: string, out: StreamEvent[]): void {
    if (piece === "") return;
    if (this.open?.messageId !== messageId) {
      if (this.open) this.close(this.open.messageId, "incomplete", out);
      const item: MessageItem = {
        type: "message",
        id: `msg_${messageId}`,
        status: "in_progress",
        role: "assistant",
        content: [],
      };
      const index = this.response.output.push(item) - 1;
      this.open = { messageId, index };
      out.push(this.event("response.output_item.added", { output_index: index, item: copy(item) }));
      const part = { type: "output_text" as const, text: "", annotations: [], logprobs: [] };
      item.content.push(part);
      out.push(
        this.event("response.content_part.added", {
          item_id: item.id,
          output_index: index,
          content_index: 0,
          part: copy(part),
        }),
      );
    }
    const item = this.response.output[this.open.index] as MessageItem;
    item.content[0].text += piece;
    out.push(
      this.event("response.output_text.delta", {
        item_id: item.id,
        output_index: this.open.index,
        content_index: 0,
        delta: piece,
        logprobs: [],
      }),
    );
  }

  private close(messageId: string, status: "completed" | "incomplete", out: StreamEvent[]): void {
    if (this.open?.messageId !== messageId) return;
    const { index } = this.open;
    this.open = undefined;
    const item = this.response.output[index] as MessageItem;
    item.status = status;
    const part = item.content[0];
    const at = { item_id: item.id, output_index: index, content_index: 0 };
    out.push(this.event("response.output_text.done", { ...at, text: part.text, logprobs: [] }));
    out.push(this.event("response.content_part.done", { ...at, part: copy(part) }));
    out.push(this.event("response.output_item.done", { output_index: index, item: copy(item) }));
  }

  private call(id: string, name: string, args: string, out: StreamEvent[]): void {
    const item: CallItem = {
      type: "function_call",
      id: `fc_${id}`,
      call_id: callIdFor(this.sessionId, id),
      name,
      arguments: "",
      status: "in_progress",
    };
    const index = this.response.output.push(item) - 1;
    out.push(this.event("response.output_item.added", { output_index: index, item: copy(item) }));
    for (let at = 0; at < args.length; at += ARGUMENT_PIECE)
      out.push(
        this.event("response.function_call_arguments.delta", {
          item_id: item.id,
          output_index: index,
          delta: args.slice(at, at + ARGUMENT_PIECE),
        }),
      );
    item.arguments = args;
    item.status = "completed";
    out.push(
      this.event("response.function_call_arguments.done", {
        item_id: item.id,
        output_index: index,
        name,
        arguments: args,
      }),
    );
    out.push(this.event("response.output_item.done", { output_index: index, item: copy(item) }));
  }

  private finish(status: ResponseStatus, out: StreamEvent[]): void {
    this.response.status = status;
    const type =
      status === "completed" || status === "cancelled"
        ? "response.completed"
        : status === "incomplete"
          ? "response.incomplete"
          : "response.failed";
    out.push(this.event(type, { response: copy(this.response) }));
  }
}
