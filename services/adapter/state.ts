// What an adapter keeps between restarts, in one JSON file: where its inbox stands (the cursor),
// how far it has taken the platform's messages (an update offset), which chat each frame and run
// answers, and which replies it has posted (the platform's message ids). Nothing else: an adapter
// killed at any moment starts again from this file. Each map keeps its newest MAX_ENTRIES.
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import path from "node:path";

/** Where a reply goes, in the platform's own terms (a chat id, a thread, the message answered). */
export type Address = Record<string, string>;

/** A posted reply: the platform's ids of its parts, and whether its final text is there. */
export interface Post {
  ids: string[];
  final: boolean;
}

const MAX_ENTRIES = 10_000;

/** A tool call put to a person in a chat, to approve or reject. */
export interface Ask {
  sessionId: string;
  toolCallId: string;
  toolName: string;
}

class Bounded<V> extends Map<string, V> {
  override set(key: string, value: V): this {
    super.delete(key);
    super.set(key, value);
    if (this.size > MAX_ENTRIES) this.delete(this.keys().next().value!);
    return this;
  }
}

export class AdapterState {
  cursor = "";
  /** The platform's own resume point (Telegram's update offset); "" when it has none. */
  offset = "";
  /** frame id (inboundFrameId) -> the chat of that message. */
  readonly frames = new Bounded<Address>();
  /** session id -> the chat of its latest message, for runs no message started (schedules). */
  readonly sessions = new Bounded<Address>();
  /** session id / turn id -> the chat the run answers. */
  readonly runs = new Bounded<Address>();
  /** session id / message id -> what was posted of that reply. */
  readonly posts = new Bounded<Post>();
  /** A question put to a person (an inline keyboard's token) -> the session and the tool call it decides. */
  readonly asks = new Bounded<Ask>();
  /** Threads the bot takes part in unmentioned (Slack: "channel:thread_ts" of the threads it answered in). */
  readonly threads = new Bounded<boolean>();
  private saving: Promise<void> = Promise.resolve();
  private soon?: NodeJS.Timeout;

  private constructor(private readonly file: string) {}

  /** The state in `file`, or an empty one when there is none; a file that does not parse is an error. */
  static async load(file: string): Promise<AdapterState> {
    const state = new AdapterState(file);
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return state;
      throw err;
    }
    let doc: Record<string, unknown>;
    try {
      doc = JSON.parse(text) as Record<string, unknown>;
    } catch (err) {
      throw new Error(`${file}: not an adapter state file (${(err as Error).message})`);
    }
    state.cursor = typeof doc.cursor === "string" ? doc.cursor : "";
    state.offset = typeof doc.offset === "string" ? doc.offset : "";
    for (const name of ["frames", "sessions", "runs", "posts", "threads", "asks"] as const) {
      const entries = doc[name];
      if (Array.isArray(entries)) for (const [k, v] of entries as [string, never][]) state[name].set(k, v);
    }
    return state;
  }

  /** Writes the state now (after what is pending); a crash leaves the old file or the new, never half of one. */
  save(): Promise<void> {
    clearTimeout(this.soon);
    this.soon = undefined;
    const doc = JSON.stringify({
      cursor: this.cursor,
      offset: this.offset,
      frames: [...this.frames],
      sessions: [...this.sessions],
      runs: [...this.runs],
      posts: [...this.posts],
      threads: [...this.threads],
      asks: [...this.asks],
    });
    this.saving = this.saving.then(async () => {
      await mkdir(path.dirname(this.file), { recursive: true });
      await writeFile(`${this.file}.tmp`, doc, { mode: 0o600 });
      await rename(`${this.file}.tmp`, this.file);
    });
    return this.saving;
  }

  /** Saves within half a second: for the cursor, which moves with every event. */
  saveSoon(): void {
    this.soon ??= setTimeout(() => void this.save().catch(() => undefined), 500);
  }

  async close(): Promise<void> {
    if (this.soon) await this.save();
    await this.saving;
  }
}
