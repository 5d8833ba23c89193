// Replies on a chat platform that can edit a message (Telegram, Slack). A streaming reply is one
// message: sent at its first text, then edited with the text so far at most once per draft
// interval, and edited a last time with the complete text. A text over the platform's limit goes
// out in parts, split at a line or word break. A rate limit is waited out for as long as the
// platform says; a draft edit that meets one is skipped, since a newer one follows.
import type { Logger } from "../shared/process/log.js";
import type { ReplySink } from "./replies.js";
import type { AdapterState, Address, Post } from "./state.js";

/** What a platform offers: post, edit, and how to read its refusals. */
export interface ChatApi {
  /** The longest text one message takes. */
  maxChars: number;
  /** Posts `text` where `to` says (`first`: the reply's first part, which answers the message); the new message's id. */
  send(to: Address, text: string, first: boolean): Promise<string>;
  /** Replaces message `id`'s text; resolves too when it already reads so. */
  edit(to: Address, id: string, text: string): Promise<void>;
  /** Seconds to wait when `err` is a rate limit; undefined for anything else. */
  retryAfterS(err: unknown): number | undefined;
  /** Whether `err` may pass if tried again (a 5xx, a network failure). */
  transient(err: unknown): boolean;
}

const GIVE_UP_MS = 10 * 60_000;

/** `text` in parts of at most `max` UTF-16 units, cut at a line break, else a word break, near the limit. */
export function splitText(text: string, max: number): string[] {
  const parts: string[] = [];
  let rest = text;
  while (rest.length > max) {
    // A line break in the second half, else a space there, else the limit.
    let cut = rest.lastIndexOf("\n", max);
    if (cut < max / 2) cut = rest.lastIndexOf(" ", max);
    if (cut < max / 2) cut = max;
    // Never between the halves of a surrogate pair.
    if (/[\ud800-\udbff]/.test(rest[cut - 1] ?? "")) cut--;
    parts.push(rest.slice(0, cut));
    rest = rest.slice(cut).replace(/^[ \n]/, "");
  }
  if (rest !== "" || parts.length === 0) parts.push(rest);
  return parts;
}

/** Calls `fn` until it succeeds: a rate limit after its wait, a transient failure after a backoff; others throw. */
async function persist<T>(api: ChatApi, fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + GIVE_UP_MS;
  for (let pauseMs = 500; ; pauseMs = Math.min(pauseMs * 2, 30_000)) {
    try {
      return await fn();
    } catch (err) {
      const after = api.retryAfterS(err);
      if (after === undefined && !api.transient(err)) throw err;
      const waitMs = after !== undefined ? after * 1000 : pauseMs;
      if (Date.now() + waitMs > deadline) throw err;
      await new Promise((r) => setTimeout(r, waitMs));
    }
  }
}

/**
 * Puts `text` in the chat as the messages `ids`: edits those there are, sends the rest, and calls
 * `sent` after each new id is added so it is kept. `showing`: what the messages are known to read
 * already, which need no edit.
 */
export async function sendText(
  api: ChatApi,
  to: Address,
  text: string,
  ids: string[],
  sent: () => Promise<void> | void,
  showing: (string | undefined)[] = [],
): Promise<void> {
  for (const [i, part] of splitText(text, api.maxChars).entries()) {
    if (ids[i] !== undefined) {
      if (showing[i] !== part) await persist(api, () => api.edit(to, ids[i]!, part));
      continue;
    }
    ids.push(await persist(api, () => api.send(to, part, i === 0)));
    await sent();
  }
}

export class DraftedReplies implements ReplySink {
  private readonly chains = new Map<string, Promise<void>>();
  private readonly pending = new Map<string, { text: string; timer: NodeJS.Timeout }>();
  private readonly shown = new Map<string, { atMs: number; text: string }>();
  /** The chat a rate limit holds back -> when the platform lets the bot write there again. */
  private readonly blockedUntil = new Map<string, number>();

  /** Puts a held tool call to the chat (the platform's questions with buttons), when it has them. */
  readonly ask?: ReplySink["ask"];

  constructor(
    private readonly api: ChatApi,
    private readonly state: AdapterState,
    private readonly intervalMs: number,
    private readonly logger: Logger,
    asks?: Required<Pick<ReplySink, "ask">>,
  ) {
    if (asks) this.ask = (to, post, held) => asks.ask(to, post, held);
  }

  draft(to: Address, key: string, post: Post, text: string): void {
    const waiting = this.pending.get(key);
    if (waiting) {
      waiting.text = text;
      return;
    }
    const now = Date.now();
    const at = Math.max(
      now,
      (this.shown.get(key)?.atMs ?? 0) + this.intervalMs,
      this.blockedUntil.get(to.chat_id!) ?? 0,
    );
    const entry = {
      text,
      timer: setTimeout(() => {
        this.pending.delete(key);
        void this.enqueue(key, () => this.showDraft(to, key, post, entry.text));
      }, at - now),
    };
    this.pending.set(key, entry);
  }

  async final(to: Address, key: string, post: Post, text: string): Promise<void> {
    const waiting = this.pending.get(key);
    if (waiting) clearTimeout(waiting.timer);
    this.pending.delete(key);
    await this.enqueue(key, async () => {
      const blocked = (this.blockedUntil.get(to.chat_id!) ?? 0) - Date.now();
      if (blocked > 0) await new Promise((r) => setTimeout(r, blocked));
      await sendText(this.api, to, text, post.ids, () => this.state.save(), [this.shown.get(key)?.text]);
    });
    this.shown.delete(key);
  }

  /** Waits for every post under way. */
  async settle(): Promise<void> {
    for (const { timer } of this.pending.values()) clearTimeout(timer);
    this.pending.clear();
    await Promise.allSettled([...this.chains.values()]);
  }

  private async showDraft(to: Address, key: string, post: Post, text: string): Promise<void> {
    const part = text.slice(0, this.api.maxChars);
    if (part.trim() === "" || this.shown.get(key)?.text === part) return;
    this.shown.set(key, { atMs: Date.now(), text: part });
    try {
      if (post.ids.length === 0) {
        post.ids.push(await this.api.send(to, part, true));
        await this.state.save();
      } else {
        await this.api.edit(to, post.ids[0]!, part);
      }
    } catch (err) {
      const after = this.api.retryAfterS(err);
      if (after !== undefined) this.blockedUntil.set(to.chat_id!, Date.now() + after * 1000);
      else this.logger.warn("a draft edit failed; the next one or the final text follows", { error: String(err) });
    }
  }

  private enqueue(key: string, fn: () => Promise<void>): Promise<void> {
    const next = (this.chains.get(key) ?? Promise.resolve()).then(fn);
    const settled = next.catch(() => undefined);
    this.chains.set(key, settled);
    void settled.then(() => this.chains.get(key) === settled && this.chains.delete(key));
    return next;
  }
}
