// A Telegram Bot API server for tests, written from the published reference
// (https://core.telegram.org/bots/api): requests to /bot<token>/<method> with JSON, form or query
// parameters; answers {"ok": true, "result"} or {"ok": false, "error_code", "description"
// [, "parameters": {"retry_after"}]}. It checks what Telegram checks for the methods an adapter
// uses: the token (401 Unauthorized), getUpdates' offset confirmation and long poll, one poller
// at a time (a newer getUpdates ends the older with 409 Conflict), sendMessage's chat, text of 1-4096 characters, topic and reply target,
// editMessageText's target (the bot's own message) and "message is not modified", and flood
// control per chat (429 with retry_after; the FAQ's one message a second per chat, with a small
// burst, and 20 a minute in groups); setWebhook's rules (HTTPS on ports 443, 80, 88 or 8443, a
// secret token of A-Z a-z 0-9 _ -), updates POSTed with X-Telegram-Bot-Api-Secret-Token and sent
// again until answered 2xx, and getUpdates refused while a webhook is set. Inline keyboards
// (sendMessage's reply_markup: buttons of 1-64 bytes of callback_data), a user's press as a
// callback_query update (sent only when allowed_updates allows it), answerCallbackQuery (once per
// query, text of at most 200 characters), and an edit without reply_markup dropping the keyboard.
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface TgChatSpec {
  id: number;
  type: "private" | "group" | "supergroup";
  title?: string;
  is_forum?: boolean;
}
export interface TgUserSpec {
  id: number;
  first_name: string;
  username?: string;
}

interface StoredMessage {
  message_id: number;
  chat: TgChatSpec;
  from: TgUserSpec & { is_bot: boolean };
  text: string;
  date: number;
  message_thread_id?: number;
  reply_to?: number;
  photo?: { file_id: string; file_unique_id: string; width: number; height: number; file_size: number }[];
  caption?: string;
  /** Every text it had, first to last (sent, then each edit). */
  versions: string[];
  reply_markup?: { inline_keyboard: { text: string; callback_data: string }[][] };
}

type Answer = { status: number; body: object | Buffer };
const ok = (result: unknown): Answer => ({ status: 200, body: { ok: true, result } });
const fail = (status: number, description: string, parameters?: object): Answer => ({
  status,
  body: { ok: false, error_code: status, description, ...(parameters ? { parameters } : {}) },
});
const badRequest = (what: string) => fail(400, `Bad Request: ${what}`);

export class TelegramApiServer {
  readonly bot = { id: 7_000_001, is_bot: true, first_name: "Troupe", username: "troupe_bot" };
  private readonly chats = new Map<number, { spec: TgChatSpec; messages: Map<number, StoredMessage>; next: number }>();
  private readonly updates: { update_id: number; message?: object; callback_query?: object }[] = [];
  /** The update types the bot asked for (getUpdates' or setWebhook's allowed_updates); undefined: Telegram's default, every common type. */
  private allowed?: string[];
  /** callback_query ids given out -> how each was answered (undefined: not yet). */
  readonly queries = new Map<string, { text?: string; show_alert?: boolean } | undefined>();
  /** file_id -> its path and bytes (getFile, then /file/bot<token>/<path>). */
  private readonly files = new Map<string, { path: string; bytes: Buffer }>();
  private nextUpdate = 1;
  private waiting: (() => void)[] = [];
  private supersede?: () => void;
  /** setWebhook's URL and secret token: updates are POSTed there, getUpdates is refused. */
  private webhook?: { url: string; secret: string };
  /** Where a public webhook URL is reached from here: the reverse proxy in front of a bot, in a test. */
  readonly proxy = new Map<string, string>();
  private delivering: Promise<void> = Promise.resolve();
  /** Webhook deliveries: the status each attempt got. */
  readonly webhookAttempts: number[] = [];
  private readonly buckets = new Map<number, { tokens: number; atMs: number; minute: number[] }>();
  private server?: http.Server;
  /** Every refused call, as "method: description", for assertions. */
  readonly refusals: string[] = [];
  /** Calls per method. */
  readonly calls = new Map<string, number>();

  constructor(
    readonly token: string,
    private readonly flood = { burst: 3, perSecond: 1, groupPerMinute: 20 },
  ) {}

  async start(): Promise<string> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        void this.route(req, Buffer.concat(chunks).toString("utf8")).then(({ status, body }) => {
          if (Buffer.isBuffer(body))
            return void res.writeHead(status, { "content-type": "application/octet-stream" }).end(body);
          res.writeHead(status, { "content-type": "application/json" });
          res.end(JSON.stringify(body));
        });
      });
    });
    await new Promise<void>((r) => this.server!.listen(0, "127.0.0.1", () => r()));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    for (const w of [...this.waiting]) w();
    this.server?.closeAllConnections();
    await new Promise((r) => this.server?.close(r));
  }

  addChat(spec: TgChatSpec): void {
    this.chats.set(spec.id, { spec, messages: new Map(), next: 1 });
  }

  /** A user writes in a chat: the message and its update, as Telegram would give them. */
  userSays(
    chatId: number,
    from: TgUserSpec,
    text: string,
    extra: { thread?: number; replyTo?: number; photo?: Buffer } = {},
  ): number {
    const chat = this.chats.get(chatId)!;
    let photo: StoredMessage["photo"];
    if (extra.photo) {
      // Telegram offers sizes of a photo; the largest is the original here.
      const id = `AgAC${this.files.size + 1}`;
      this.files.set(id, { path: `photos/file_${this.files.size + 1}.jpg`, bytes: extra.photo });
      photo = [
        { file_id: `${id}-thumb`, file_unique_id: `u${id}t`, width: 90, height: 90, file_size: 1200 },
        { file_id: id, file_unique_id: `u${id}`, width: 800, height: 600, file_size: extra.photo.length },
      ];
    }
    const m: StoredMessage = {
      message_id: chat.next++,
      chat: chat.spec,
      from: { ...from, is_bot: false },
      text,
      date: Math.floor(Date.now() / 1000),
      message_thread_id: extra.thread,
      reply_to: extra.replyTo,
      versions: [text],
      ...(photo ? { photo, caption: text, text: "" } : {}),
    };
    chat.messages.set(m.message_id, m);
    const update = { update_id: this.nextUpdate++, message: this.wire(m) };
    if (this.webhook) this.deliver(update, this.webhook);
    else {
      this.updates.push(update);
      for (const w of [...this.waiting]) w();
    }
    return m.message_id;
  }

  /**
   * A user presses a button of an inline keyboard on the bot's message: a callback_query update,
   * if the bot's allowed_updates take them (Telegram sends no other kind). Returns the query's id.
   */
  press(chatId: number, messageId: number, from: TgUserSpec, data: string): string {
    const chat = this.chats.get(chatId)!;
    const m = chat.messages.get(messageId)!;
    const id = `${Date.now()}${this.queries.size}`;
    this.queries.set(id, undefined);
    if (this.allowed && !this.allowed.includes("callback_query")) return id;
    const update = {
      update_id: this.nextUpdate++,
      callback_query: {
        id,
        from: { ...from, is_bot: false },
        message: this.wire(m),
        chat_instance: String(chatId),
        data,
      },
    };
    if (this.webhook) this.deliver(update, this.webhook);
    else {
      this.updates.push(update);
      for (const w of [...this.waiting]) w();
    }
    return id;
  }

  /** POSTs an update to the webhook, in order, again after a failure (a second apart here), as Telegram does. */
  private deliver(update: object, hook: { url: string; secret: string }): void {
    this.delivering = this.delivering.then(async () => {
      const target = this.proxy.get(hook.url) ?? hook.url;
      for (let attempt = 0; attempt < 10; attempt++) {
        const status = await fetch(target, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            ...(hook.secret ? { "x-telegram-bot-api-secret-token": hook.secret } : {}),
          },
          body: JSON.stringify(update),
          signal: AbortSignal.timeout(10_000),
        }).then(
          (r) => r.status,
          () => 0,
        );
        this.webhookAttempts.push(status);
        if (status >= 200 && status < 300) return;
        await new Promise((r) => setTimeout(r, 1000));
      }
    });
  }

  /** The bot's messages in a chat, oldest first. */
  botMessages(chatId: number): StoredMessage[] {
    return [...this.chats.get(chatId)!.messages.values()].filter((m) => m.from.is_bot);
  }

  private wire(m: StoredMessage): object {
    const chat = this.chats.get(m.chat.id)!;
    const replied = m.reply_to === undefined ? undefined : chat.messages.get(m.reply_to);
    return {
      message_id: m.message_id,
      date: m.date,
      chat: m.chat,
      from: m.from,
      ...(m.photo ? { photo: m.photo, caption: m.caption } : { text: m.text }),
      ...(m.message_thread_id !== undefined ? { message_thread_id: m.message_thread_id, is_topic_message: true } : {}),
      ...(replied ? { reply_to_message: this.wire({ ...replied, reply_to: undefined }) } : {}),
      ...(m.reply_markup ? { reply_markup: m.reply_markup } : {}),
    };
  }

  private async route(req: http.IncomingMessage, raw: string): Promise<Answer> {
    const url = new URL(req.url ?? "/", "http://x");
    // Downloads: https://api.telegram.org/file/bot<token>/<file_path> (getFile's answer).
    const download = /^\/file\/bot([^/]+)\/(.+)$/.exec(url.pathname);
    if (download) {
      const file = [...this.files.values()].find((f) => f.path === download[2]);
      if (download[1] !== this.token || !file) return fail(404, "Not Found");
      return { status: 200, body: file.bytes };
    }
    const m = /^\/bot([^/]+)\/([A-Za-z]+)$/.exec(url.pathname);
    if (!m) return fail(404, "Not Found");
    if (m[1] !== this.token) return fail(401, "Unauthorized");
    const method = m[2]!;
    this.calls.set(method, (this.calls.get(method) ?? 0) + 1);
    let params: Record<string, unknown> = Object.fromEntries(url.searchParams);
    const type = req.headers["content-type"] ?? "";
    try {
      if (type.startsWith("application/json") && raw !== "") params = { ...params, ...JSON.parse(raw) };
      else if (type.startsWith("application/x-www-form-urlencoded"))
        params = { ...params, ...Object.fromEntries(new URLSearchParams(raw)) };
    } catch {
      return badRequest("can't parse JSON object");
    }
    const answer = await this.method(method, params);
    if ((answer.body as { ok?: boolean }).ok === false)
      this.refusals.push(`${method}: ${(answer.body as { description: string }).description}`);
    return answer;
  }

  private async method(method: string, p: Record<string, unknown>): Promise<Answer> {
    switch (method) {
      case "getMe":
        return ok(this.bot);
      case "getUpdates":
        return this.getUpdates(p);
      case "sendMessage":
        return this.sendMessage(p);
      case "editMessageText":
        return this.editMessageText(p);
      case "answerCallbackQuery": {
        const id = String(p.callback_query_id ?? "");
        if (!this.queries.has(id) || this.queries.get(id) !== undefined)
          return badRequest("query is too old and response timeout expired or query ID is invalid");
        if (p.text !== undefined && String(p.text).length > 200) return badRequest("MESSAGE_TOO_LONG");
        this.queries.set(id, {
          text: p.text === undefined ? undefined : String(p.text),
          show_alert: p.show_alert === true || p.show_alert === "true",
        });
        return ok(true);
      }
      case "setWebhook": {
        const url = String(p.url ?? "");
        if (!URL.canParse(url) || new URL(url).protocol !== "https:")
          return badRequest("bad webhook: An HTTPS URL must be provided for webhook");
        const parsed = new URL(url);
        if (parsed.port !== "" && !["443", "80", "88", "8443"].includes(parsed.port))
          return badRequest("bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443");
        const secret = String(p.secret_token ?? "");
        if (secret !== "" && !/^[A-Za-z0-9_-]{1,256}$/.test(secret))
          return badRequest("secret token contains unallowed characters");
        this.webhook = { url, secret };
        if (p.allowed_updates !== undefined) this.allowed = this.updateTypes(p.allowed_updates);
        return ok(true);
      }
      case "deleteWebhook":
        this.webhook = undefined;
        return ok(true);
      case "getFile": {
        const file = this.files.get(String(p.file_id));
        if (!file) return badRequest("invalid file_id");
        return ok({
          file_id: p.file_id,
          file_unique_id: `u${p.file_id}`,
          file_size: file.bytes.length,
          file_path: file.path,
        });
      }
      default:
        return fail(404, "Not Found: method not found");
    }
  }

  private async getUpdates(p: Record<string, unknown>): Promise<Answer> {
    if (this.webhook)
      return fail(
        409,
        "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
      );
    // A newer getUpdates ends the one still waiting: that one is answered 409, as Telegram does.
    this.supersede?.();
    if (p.allowed_updates !== undefined) this.allowed = this.updateTypes(p.allowed_updates);
    const offset = p.offset === undefined ? undefined : Number(p.offset);
    const timeoutS = Math.min(Number(p.timeout ?? 0), 50);
    // An offset confirms every update before it: they are never returned again.
    if (offset !== undefined && Number.isFinite(offset))
      while (this.updates[0] && this.updates[0].update_id < offset) this.updates.shift();
    if (this.updates.length === 0 && timeoutS > 0) {
      const superseded = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => done(false), timeoutS * 1000);
        const done = (v: boolean) => {
          clearTimeout(timer);
          this.waiting = this.waiting.filter((w) => w !== wake);
          if (this.supersede === supersede) this.supersede = undefined;
          resolve(v);
        };
        const wake = () => done(false);
        const supersede = () => done(true);
        this.waiting.push(wake);
        this.supersede = supersede;
      });
      if (superseded)
        return fail(
          409,
          "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
        );
    }
    return ok(this.updates.slice(0, Math.min(Number(p.limit ?? 100), 100)));
  }

  /** allowed_updates as JSON or (from a form) a JSON string. */
  private updateTypes(v: unknown): string[] {
    const list = typeof v === "string" ? (JSON.parse(v) as unknown) : v;
    return Array.isArray(list) ? list.map(String) : [];
  }

  /** An inline keyboard's problem, as the Bot API words it; undefined when it is fine. */
  private markupProblem(markup: unknown): string | undefined {
    if (markup === undefined) return undefined;
    const rows = (markup as { inline_keyboard?: unknown })?.inline_keyboard;
    if (!Array.isArray(rows)) return 'field "inline_keyboard" must be an Array';
    for (const row of rows)
      for (const b of Array.isArray(row) ? row : [row]) {
        const button = b as { text?: unknown; callback_data?: unknown };
        if (typeof button?.text !== "string" || button.text === "")
          return "text buttons are unallowed in the inline keyboard";
        const data = button.callback_data;
        if (typeof data !== "string" || Buffer.byteLength(data) < 1 || Buffer.byteLength(data) > 64)
          return "BUTTON_DATA_INVALID";
      }
    return undefined;
  }

  private chatOf(p: Record<string, unknown>) {
    const id = typeof p.chat_id === "string" && /^-?\d+$/.test(p.chat_id) ? Number(p.chat_id) : p.chat_id;
    return typeof id === "number" ? this.chats.get(id) : undefined;
  }

  private textProblem(text: unknown): string | undefined {
    if (typeof text !== "string" || text.trim() === "") return "message text is empty";
    if (text.length > 4096) return "message is too long";
    return undefined;
  }

  /** Flood control: a bucket of `burst` per chat refilled at perSecond, and groupPerMinute in groups. */
  private flooded(chat: TgChatSpec): Answer | undefined {
    const now = Date.now();
    const b = this.buckets.get(chat.id) ?? { tokens: this.flood.burst, atMs: now, minute: [] };
    this.buckets.set(chat.id, b);
    b.tokens = Math.min(this.flood.burst, b.tokens + ((now - b.atMs) / 1000) * this.flood.perSecond);
    b.atMs = now;
    b.minute = b.minute.filter((t) => now - t < 60_000);
    let waitS = 0;
    if (b.tokens < 1) waitS = Math.ceil((1 - b.tokens) / this.flood.perSecond);
    if (chat.type !== "private" && b.minute.length >= this.flood.groupPerMinute)
      waitS = Math.max(waitS, Math.ceil((60_000 - (now - b.minute[0]!)) / 1000));
    if (waitS > 0) return fail(429, `Too Many Requests: retry after ${waitS}`, { retry_after: waitS });
    b.tokens -= 1;
    b.minute.push(now);
    return undefined;
  }

  private sendMessage(p: Record<string, unknown>): Answer {
    const chat = this.chatOf(p);
    if (!chat) return badRequest("chat not found");
    const bad = this.textProblem(p.text);
    if (bad) return badRequest(bad);
    const thread = p.message_thread_id === undefined ? undefined : Number(p.message_thread_id);
    if (thread !== undefined && (!chat.spec.is_forum || !Number.isInteger(thread)))
      return badRequest("message thread not found");
    const reply = p.reply_parameters as { message_id?: unknown; allow_sending_without_reply?: boolean } | undefined;
    if (reply && !chat.messages.has(Number(reply.message_id)) && !reply.allow_sending_without_reply)
      return badRequest("message to be replied not found");
    const markup = typeof p.reply_markup === "string" ? JSON.parse(p.reply_markup) : p.reply_markup;
    const badMarkup = this.markupProblem(markup);
    if (badMarkup) return badRequest(badMarkup);
    const flooded = this.flooded(chat.spec);
    if (flooded) return flooded;
    const m: StoredMessage = {
      ...(markup ? { reply_markup: markup } : {}),
      message_id: chat.next++,
      chat: chat.spec,
      from: this.bot,
      text: p.text as string,
      date: Math.floor(Date.now() / 1000),
      message_thread_id: thread,
      reply_to: reply ? Number(reply.message_id) : undefined,
      versions: [p.text as string],
    };
    chat.messages.set(m.message_id, m);
    return ok(this.wire(m));
  }

  private editMessageText(p: Record<string, unknown>): Answer {
    const chat = this.chatOf(p);
    if (!chat) return badRequest("chat not found");
    if (p.message_id === undefined) return badRequest("message identifier is not specified");
    const m = chat.messages.get(Number(p.message_id));
    if (!m) return badRequest("message to edit not found");
    if (!m.from.is_bot) return badRequest("message can't be edited");
    const bad = this.textProblem(p.text);
    if (bad) return badRequest(bad === "message is too long" ? "MESSAGE_TOO_LONG" : bad);
    if (p.text === m.text)
      return badRequest(
        "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
      );
    const flooded = this.flooded(chat.spec);
    if (flooded) return flooded;
    m.text = p.text as string;
    m.versions.push(m.text);
    // An edit without reply_markup leaves the message without its inline keyboard.
    const markup = typeof p.reply_markup === "string" ? JSON.parse(p.reply_markup) : p.reply_markup;
    if (markup === undefined) delete m.reply_markup;
    else m.reply_markup = markup;
    return ok(this.wire(m));
  }
}
