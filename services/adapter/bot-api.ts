// A small client of Telegram's Bot API (https://core.telegram.org/bots/api, "Making requests"):
// every method is POST https://api.telegram.org/bot<token>/<method> with a JSON body, answered by
// {"ok": true, "result": ...} or {"ok": false, "error_code", "description", "parameters"}, where
// parameters.retry_after is how long flood control asks to wait. Only what the adapter uses.
import { jsonUpTo } from "../shared/net/bounded-body.js";

/** The longest answer read: getUpdates returns at most 100 updates. */
const MAX_ANSWER_BYTES = 16 * 1024 * 1024;

export class BotApiError extends Error {
  constructor(
    readonly code: number,
    readonly description: string,
    /** Seconds to wait, for 429 Too Many Requests. */
    readonly retryAfterS?: number,
  ) {
    super(`Bot API ${code}: ${description}`);
  }
}

export interface TgUser {
  id: number;
  is_bot: boolean;
  first_name: string;
  last_name?: string;
  username?: string;
}

export interface TgChat {
  id: number;
  type: "private" | "group" | "supergroup" | "channel";
  title?: string;
  first_name?: string;
  last_name?: string;
  username?: string;
  is_forum?: boolean;
}

export interface TgMessage {
  message_id: number;
  date: number;
  chat: TgChat;
  from?: TgUser;
  text?: string;
  caption?: string;
  message_thread_id?: number;
  is_topic_message?: boolean;
  reply_to_message?: TgMessage;
  photo?: { file_id: string; file_unique_id: string; width: number; height: number; file_size?: number }[];
  document?: { file_id: string; file_name?: string; mime_type?: string; file_size?: number };
}

export interface TgUpdate {
  update_id: number;
  message?: TgMessage;
  callback_query?: TgCallbackQuery;
}

/** A press of an inline keyboard's button (https://core.telegram.org/bots/api#callbackquery). */
export interface TgCallbackQuery {
  id: string;
  from: TgUser;
  /** The bot's message the button was on (absent when too old). */
  message?: TgMessage;
  data?: string;
}

export class BotApi {
  constructor(
    private readonly apiUrl: string,
    private readonly token: string,
  ) {}

  async call<T>(method: string, params: object = {}, signal?: AbortSignal): Promise<T> {
    const res = await fetch(`${this.apiUrl.replace(/\/$/, "")}/bot${this.token}/${method}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(params),
      signal,
    });
    let body: {
      ok?: boolean;
      result?: T;
      error_code?: number;
      description?: string;
      parameters?: { retry_after?: number };
    };
    try {
      body = (await jsonUpTo(res, MAX_ANSWER_BYTES)) as typeof body;
    } catch {
      throw new BotApiError(res.status, `not a Bot API answer (HTTP ${res.status})`);
    }
    if (body.ok === true) return body.result as T;
    throw new BotApiError(body.error_code ?? res.status, body.description ?? "", body.parameters?.retry_after);
  }
}
