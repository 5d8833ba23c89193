// A session's messages as its actor holds them. The log is the record of every message; the actor
// holds only the part the model can still see (from the latest compaction's cut, or the latest
// reset, on) and a tally of the rest, so a session's memory is bounded by its context window and
// not by its age. Indexes outside this file are absolute (a message's place in the whole history,
// as the log numbers it), except inside `messages`, which starts at absolute index `released`.
import { create } from "@bufbuild/protobuf";
import { Role, UsageSchema, type ChatMessage, type Usage } from "../../shared/gen/troupe/v1/session_pb.js";
import { addUsage } from "../loop/model-call.js";
import type { Compaction } from "../loop/run.js";

/** How long messages read back from the log for a page are kept after the last page that used them. */
const READ_BACK_MS = 30_000;

export class HeldHistory {
  /** The held messages, from absolute index `released` on; runs read and append to this array. */
  readonly messages: ChatMessage[] = [];
  /** How many messages before `messages[0]` were let go. */
  released = 0;
  /** Token usage of the replies let go. */
  private releasedUsage = create(UsageSchema);
  /** User and assistant messages let go. */
  releasedConversation = 0;
  /** Messages let go, as last read back from the log for a page (page). */
  private readBack?: { messages: ChatMessage[]; timer: NodeJS.Timeout };

  /** Every message the session has had. */
  get length(): number {
    return this.released + this.messages.length;
  }

  /** Token usage of every reply the session has had. */
  usage(): Usage {
    const total = create(UsageSchema);
    addUsage(total, this.releasedUsage);
    for (const m of this.messages) addUsage(total, m.usage);
    return total;
  }

  /** Absolute index of the held message `id`; -1 when it is not held. */
  indexOf(id: string): number {
    const i = this.messages.findIndex((m) => m.id === id);
    return i < 0 ? -1 : this.released + i;
  }

  /**
   * Messages [offset, offset + size) by absolute index. Those let go are read back through
   * `readLog` (every message of the log, in order) and kept for READ_BACK_MS after the last page
   * that needed them, so a client paging through a long history reads its log once, not per page.
   */
  async page(offset: number, size: number, readLog: () => Promise<ChatMessage[]>): Promise<ChatMessage[]> {
    const released = this.released;
    const end = offset + size;
    const held = this.messages.slice(Math.max(0, offset - released), Math.max(0, end - released));
    if (offset >= released) return held;
    // What was let go never changes (a rebuild from the log clears it), so an earlier read serves.
    if (!this.readBack || this.readBack.messages.length < Math.min(end, released)) {
      const messages = (await readLog()).slice(0, released);
      this.forgetReadBack();
      this.readBack = { messages, timer: setTimeout(() => this.forgetReadBack(), READ_BACK_MS) };
    }
    this.readBack.timer.refresh().unref();
    return [...this.readBack.messages.slice(offset, Math.min(end, released)), ...held];
  }

  /**
   * Lets go of the messages the model will not see again: those before the compaction's cut or
   * the reset at absolute index `contextFrom`. Returns the compaction still in force: none once a
   * reset came after it, as its summary is of messages the model no longer sees.
   */
  releaseUnseen(compaction: Compaction | undefined, contextFrom: number): Compaction | undefined {
    // As conversationView reads it: a cut it cannot find starts the view at the beginning.
    const cut = Math.max(compaction ? this.indexOf(compaction.firstKeptMessageId) : 0, 0);
    const kept = compaction && cut >= contextFrom ? compaction : undefined;
    this.release(Math.max(kept ? cut : 0, contextFrom));
    return kept;
  }

  /** Lets go of the messages before absolute index `upTo` (the log keeps them). */
  private release(upTo: number): void {
    const n = Math.min(upTo - this.released, this.messages.length);
    if (n <= 0) return;
    for (const m of this.messages.splice(0, n)) {
      addUsage(this.releasedUsage, m.usage);
      if (m.role === Role.USER || m.role === Role.ASSISTANT) this.releasedConversation++;
    }
    this.released += n;
  }

  private forgetReadBack(): void {
    if (this.readBack) clearTimeout(this.readBack.timer);
    this.readBack = undefined;
  }

  /** Forgets everything, for a rebuild from the log. */
  clear(): void {
    this.forgetReadBack();
    this.messages.length = 0;
    this.released = 0;
    this.releasedConversation = 0;
    this.releasedUsage = create(UsageSchema);
  }
}
