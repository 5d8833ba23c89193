// What a reader of a session's events has shown of each assistant message, across a replay's gap.
// A replay after a lost connection sends a `gap` event at its own seq when the deltas it lost are
// not kept: a message that started before that seq may have lost some, so from the gap on its
// deltas are held back and its end (which carries the complete text) supplies the rest. Messages
// that start after the gap stream as usual. troupe chat (services/cli/chat.ts) and the OpenAI
// endpoint (services/gateway/http/openai-compat.ts) both show text by this one rule.
export class StreamedText {
  private readonly shown = new Map<string, string>();
  private readonly startedAt = new Map<string, bigint>();
  private gapAt = -1n;

  /** An assistant message started, at `seq`. */
  start(id: string, seq: bigint): void {
    this.startedAt.set(id, seq);
    this.shown.set(id, "");
  }

  /** A replay's gap, at `seq`. */
  gap(seq: bigint): void {
    this.gapAt = seq;
  }

  /** A text delta of message `id`: what of it to show now ("" once the message has lost deltas). */
  delta(id: string, text: string): string {
    if (this.lostDeltas(id)) return "";
    this.shown.set(id, (this.shown.get(id) ?? "") + text);
    return text;
  }

  /**
   * Message `id` ended with `full` as its text: what to show beyond what was, which is nothing
   * when every delta came. Where what was shown is not the start of `full`, the whole of it
   * follows on a new line.
   */
  end(id: string, full: string): string {
    const shown = this.shown.get(id) ?? "";
    const lost = this.lostDeltas(id);
    this.shown.delete(id);
    this.startedAt.delete(id);
    if (full.startsWith(shown)) return full.slice(shown.length);
    return lost ? `\n${full}` : "";
  }

  /** The run went on after a restart, which asks again for any message it cut off: what was shown of those. */
  resumed(): string[] {
    const cut = [...this.shown.values()];
    this.shown.clear();
    this.startedAt.clear();
    return cut;
  }

  private lostDeltas(id: string): boolean {
    return this.gapAt >= 0n && (this.startedAt.get(id) ?? -1n) < this.gapAt;
  }
}
