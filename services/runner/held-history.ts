// A session's messages as its actor holds them. The log is the record of every message; the actor
// holds only the part the model can still see (from the latest compaction's cut, or the latest
// reset, on) and a tally of the rest, so a session's memory is bounded by its context window and
// not by its age. Indexes outside this file are absolute (a message's place in the whole history,
// as the log numbers it), except inside `messages`, which starts at absolute index `released`.
import { create } from "@bufbuild/protobuf";
import { Role, UsageSchema, type ChatMessage, type Usage } from "../shared/gen/troupe/v1/session_pb.js";
import { addUsage } from "./model-call.js";
import type { Compaction } from "./run.js";

export class HeldHistory {
  /** The held messages, from absolute index `released` on; runs read and append to this array. */
  readonly messages: ChatMessage[] = [];
  /** How many messages before `messages[0]` were let go. */
  released = 0;
  /** Token usage of the replies let go. */
  private releasedUsage = create(UsageSchema);
  /** User and assistant messages let go. */
  releasedConversation = 0;

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

  /** Messages [offset, offset + size) by absolute index; undefined when some were let go (read the log). */
  page(offset: number, size: number): ChatMessage[] | undefined {
    if (offset < this.released) return undefined;
    return this.messages.slice(offset - this.released, offset - this.released + size);
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

  /** Forgets everything, for a rebuild from the log. */
  clear(): void {
    this.messages.length = 0;
    this.released = 0;
    this.releasedConversation = 0;
    this.releasedUsage = create(UsageSchema);
  }
}
