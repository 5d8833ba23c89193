// The outbound half of every adapter: reads the gateway's inbox (SubscribeInbox) from the saved
// cursor and turns each run's assistant messages into the platform's replies, sent to the chat of
// the message that started the run, each session in order and sessions side by side. Streaming
// text goes to `draft` (the platform edits a message at a bounded rate); the complete message
// goes to `final`, awaited, and recorded before the cursor passes it, so a restarted adapter
// neither loses a reply nor posts one twice.
import type { AgentEvent } from "../shared/gen/troupe/v1/session_pb.js";
import { Role, StopReason } from "../shared/gen/troupe/v1/session_pb.js";
import { Status, grpcCode } from "../shared/errors.js";
import type { Logger } from "../shared/process/log.js";
import type { GatewayClient } from "./deliver.js";
import type { AdapterState, Address, Post } from "./state.js";

/** Events read ahead of the oldest one not yet handled; beyond it, reading waits. */
const MAX_IN_FLIGHT = 1000;

/** What a platform does with replies. */
export interface ReplySink {
  /** Shows the reply so far; may skip calls to keep within the platform's rate. Never throws. */
  draft?(to: Address, key: string, post: Post, text: string): void;
  /** Posts the complete reply (editing the draft when there is one); resolves once the platform has it. */
  final(to: Address, key: string, post: Post, text: string): Promise<void>;
  /** Puts a held tool call to the people of the chat, with buttons to decide; resolves once posted. */
  ask?(to: Address, post: Post, held: HeldCall): Promise<void>;
}

/** A tool call a run holds for a decision (ToolApprovalRequested). */
export interface HeldCall {
  sessionId: string;
  toolCallId: string;
  toolName: string;
  argumentsJson: string;
  rule: string;
}

export class InboxReplies {
  private call?: ReturnType<GatewayClient["subscribeInbox"]>;
  private stopped = false;
  private running?: Promise<void>;
  /** message id -> text so far, for messages whose start this process saw. */
  private readonly drafts = new Map<string, string>();
  /** Each session's events, handled one after another. */
  private readonly chains = new Map<string, Promise<void>>();
  /** Events handed to their session's chain, in the inbox's order, until the cursor passes them. */
  private readonly inFlight: { cursor: string; done: boolean; handled: Promise<void> }[] = [];

  constructor(
    private readonly gateway: GatewayClient,
    private readonly state: AdapterState,
    private readonly sink: ReplySink,
    private readonly logger: Logger,
  ) {}

  start(): void {
    this.running = this.loop();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.call?.cancel();
    await this.running;
  }

  /**
   * Reads the inbox, again and again: a broken stream is opened again after a pause, from the
   * cursor. Sessions are handled side by side, each in order, so one chat waiting out a rate
   * limit holds up no other; the saved cursor moves only past events handled with all before them.
   */
  private async loop(): Promise<void> {
    let pauseMs = 500;
    while (!this.stopped) {
      const call = this.gateway.subscribeInbox({ afterCursor: this.state.cursor });
      this.call = call;
      try {
        for await (const res of call) {
          pauseMs = 500;
          this.dispatch(res.event!, res.cursor);
          if (this.inFlight.length >= MAX_IN_FLIGHT) await this.inFlight[0]!.handled;
        }
      } catch (err) {
        if (this.stopped) break;
        if (grpcCode(err) === Status.INVALID_ARGUMENT) {
          this.logger.error("the gateway refused the saved inbox cursor; delete the state file to start over", {
            error: String(err),
          });
          throw err;
        }
        this.logger.warn("inbox stream broke; opening it again", { error: String(err), pauseMs });
      }
      // What is under way finishes first: the next stream starts where it left off, and must not
      // hand the same event to a second chain while the first still holds it.
      await this.settle();
      await new Promise((r) => setTimeout(r, pauseMs));
      pauseMs = Math.min(pauseMs * 2, 15_000);
    }
    await this.settle();
  }

  private dispatch(event: AgentEvent, cursor: string): void {
    const session = event.sessionId;
    const entry = { cursor, done: false, handled: Promise.resolve() };
    const chain = (this.chains.get(session) ?? Promise.resolve())
      .then(() => this.handle(event))
      .catch((err) =>
        this.logger.error("an inbox event could not be handled", { sessionId: session, error: String(err) }),
      )
      .then(() => {
        entry.done = true;
        this.advance();
        if (this.chains.get(session) === chain) this.chains.delete(session);
      });
    entry.handled = chain;
    this.chains.set(session, chain);
    this.inFlight.push(entry);
  }

  /** The saved cursor: the last of the events handled together with every event before them. */
  private advance(): void {
    let moved = false;
    while (this.inFlight[0]?.done) {
      this.state.cursor = this.inFlight.shift()!.cursor;
      moved = true;
    }
    if (moved) this.state.saveSoon();
  }

  private async settle(): Promise<void> {
    await Promise.all([...this.chains.values()]);
  }

  private async handle(event: AgentEvent): Promise<void> {
    const session = event.sessionId;
    const run = `${session}/${event.turnId}`;
    const p = event.payload;
    if (p.case === "agentStart") {
      // A message's run answers in its chat; a schedule's, in the chat it was made in (its origin,
      // refreshed here so that a schedule in use keeps it); failing both, the session's latest chat.
      const origin = p.value.originFrameId ? this.state.frames.get(p.value.originFrameId) : undefined;
      if (origin) this.state.frames.set(p.value.originFrameId, origin);
      const to = this.state.frames.get(p.value.frameId) ?? origin ?? this.state.sessions.get(session);
      if (to) this.state.runs.set(run, to);
      else this.logger.warn("no chat is known for this run; its replies are dropped", { sessionId: session });
      return;
    }
    const to = this.state.runs.get(run);
    if (!to) return;
    if (p.case === "messageStart" && p.value.message?.role === Role.ASSISTANT) {
      this.drafts.set(p.value.message.id, "");
    } else if (p.case === "messageUpdate" && p.value.delta.case === "text") {
      const sofar = this.drafts.get(p.value.messageId);
      if (sofar === undefined) return;
      const text = sofar + p.value.delta.value;
      this.drafts.set(p.value.messageId, text);
      const key = `${session}/${p.value.messageId}`;
      this.sink.draft?.(to, key, this.postOf(key), text);
    } else if (p.case === "messageEnd" && p.value.message?.role === Role.ASSISTANT) {
      this.drafts.delete(p.value.message.id);
      await this.finish(to, `${session}/${p.value.message.id}`, p.value.message.text);
    } else if (p.case === "toolApprovalRequested" && this.sink.ask) {
      // Asked once, whatever restarts: the post records that the question went out.
      const post = this.postOf(`${session}/${p.value.toolCallId}/ask`);
      if (post.final) return;
      const { toolCallId, toolName, argumentsJson, rule } = p.value;
      try {
        await this.sink.ask(to, post, { sessionId: session, toolCallId, toolName, argumentsJson, rule });
      } catch (err) {
        this.logger.error("a tool call could not be put to the chat; decide it elsewhere", {
          sessionId: session,
          toolCallId,
          error: String(err),
        });
      }
      post.final = true;
      await this.state.save();
    } else if (p.case === "agentEnd" && p.value.stopReason === StopReason.ERROR) {
      await this.finish(to, `${run}/error`, `The agent could not answer: ${p.value.errorMessage || "it failed"}`);
    }
  }

  private postOf(key: string): Post {
    let post = this.state.posts.get(key);
    if (!post) this.state.posts.set(key, (post = { ids: [], final: false }));
    return post;
  }

  private async finish(to: Address, key: string, text: string): Promise<void> {
    if (text.trim() === "") return;
    const post = this.postOf(key);
    if (post.final) return;
    try {
      await this.sink.final(to, key, post, text);
    } catch (err) {
      // Refused for good (a chat that is gone, a bot removed from it): later replies must not wait behind it.
      this.logger.error("a reply could not be posted; it is dropped", { key, error: String(err) });
    }
    post.final = true;
    await this.state.save();
  }
}
