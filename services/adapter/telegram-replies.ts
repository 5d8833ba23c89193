// Replies in Telegram. A streaming reply is one message: sent at its first text, then edited with
// the text so far at most once per draft interval (Telegram asks bots to stay near one message a
// second per chat, https://core.telegram.org/bots/faq#my-bot-is-hitting-limits-how-do-i-avoid-this),
// and edited a last time with the complete text. A text over 4096 characters (sendMessage's
// limit) goes out in parts, split at a line or word break. A 429 is waited out for as long as its
// retry_after says; a draft edit that meets one is skipped, since a newer one follows.
import type { Logger } from "../shared/log.js";
import { BotApiError, type BotApi, type TgMessage } from "./bot-api.js";
import type { ReplySink } from "./replies.js";
import type { AdapterState, Address, Post } from "./state.js";

export const MAX_CHARS = 4096;
const GIVE_UP_MS = 10 * 60_000;
const NOT_MODIFIED = /message is not modified/i;

/** `text` in parts of at most `max` UTF-16 units, cut at a line break, else a word break, near the limit. */
export function splitText(text: string, max = MAX_CHARS): string[] {
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

/** Calls `fn` until it succeeds: a 429 after its retry_after, a 5xx or network failure after a backoff; other refusals throw. */
async function persist<T>(fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + GIVE_UP_MS;
  for (let pauseMs = 500; ; pauseMs = Math.min(pauseMs * 2, 30_000)) {
    try {
      return await fn();
    } catch (err) {
      const api = err instanceof BotApiError ? err : undefined;
      if (api && api.code !== 429 && api.code < 500) throw err;
      const waitMs = api?.retryAfterS ? api.retryAfterS * 1000 : pauseMs;
      if (Date.now() + waitMs > deadline) throw err;
      await new Promise((r) => setTimeout(r, waitMs));
    }
  }
}

/** sendMessage's parameters for a reply to `to`: its chat, its topic, and the message it answers. */
const replyTo = (to: Address) => ({
  chat_id: to.chat_id,
  ...(to.thread_id ? { message_thread_id: Number(to.thread_id) } : {}),
  ...(to.message_id
    ? { reply_parameters: { message_id: Number(to.message_id), allow_sending_without_reply: true } }
    : {}),
});

/**
 * Puts `text` in the chat as the messages `ids`: edits those there are, sends the rest (the first
 * as a reply to the message answered), and calls `sent` after each new id is added so it is kept.
 * `showing`: what the messages are known to read already, which need no edit.
 */
export async function sendText(
  api: BotApi,
  to: Address,
  text: string,
  ids: string[],
  sent: () => Promise<void> | void,
  showing: (string | undefined)[] = [],
): Promise<void> {
  for (const [i, part] of splitText(text).entries()) {
    if (ids[i] !== undefined && showing[i] === part) continue;
    if (ids[i] !== undefined) {
      await persist(() =>
        api.call("editMessageText", { chat_id: to.chat_id, message_id: Number(ids[i]), text: part }).catch((err) => {
          if (!(err instanceof BotApiError && NOT_MODIFIED.test(err.description))) throw err;
        }),
      );
      continue;
    }
    const where = i === 0 ? replyTo(to) : { ...replyTo(to), reply_parameters: undefined };
    const msg = await persist(() => api.call<TgMessage>("sendMessage", { ...where, text: part }));
    ids.push(String(msg.message_id));
    await sent();
  }
}

export class TelegramReplies implements ReplySink {
  private readonly chains = new Map<string, Promise<void>>();
  private readonly pending = new Map<string, { text: string; timer: NodeJS.Timeout }>();
  private readonly shown = new Map<string, { atMs: number; text: string }>();
  /** chat id -> when flood control lets the bot write there again. */
  private readonly blockedUntil = new Map<string, number>();

  constructor(
    private readonly api: BotApi,
    private readonly state: AdapterState,
    private readonly intervalMs: number,
    private readonly logger: Logger,
  ) {}

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
      this.blockedUntil.get(to.chat_id) ?? 0,
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
      const blocked = (this.blockedUntil.get(to.chat_id) ?? 0) - Date.now();
      if (blocked > 0) await new Promise((r) => setTimeout(r, blocked));
      await sendText(this.api, to, text, post.ids, () => this.state.save(), [this.shown.get(key)?.text]);
    });
    this.shown.delete(key);
  }

  /** Waits for every edit under way. */
  async settle(): Promise<void> {
    for (const { timer } of this.pending.values()) clearTimeout(timer);
    this.pending.clear();
    await Promise.allSettled([...this.chains.values()]);
  }

  private async showDraft(to: Address, key: string, post: Post, text: string): Promise<void> {
    const part = text.slice(0, MAX_CHARS);
    if (part.trim() === "" || this.shown.get(key)?.text === part) return;
    this.shown.set(key, { atMs: Date.now(), text: part });
    try {
      if (post.ids.length === 0) {
        const msg = await this.api.call<TgMessage>("sendMessage", { ...replyTo(to), text: part });
        post.ids.push(String(msg.message_id));
        await this.state.save();
      } else {
        await this.api.call("editMessageText", { chat_id: to.chat_id, message_id: Number(post.ids[0]), text: part });
      }
    } catch (err) {
      if (err instanceof BotApiError && err.retryAfterS)
        this.blockedUntil.set(to.chat_id, Date.now() + err.retryAfterS * 1000);
      else if (!(err instanceof BotApiError && NOT_MODIFIED.test(err.description)))
        this.logger.warn("a draft edit failed; the next one or the final text follows", { error: String(err) });
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
