// Slack for tests, written from its published references: the Web API methods an adapter calls
// (https://api.slack.com/methods/auth.test, /chat.postMessage, /chat.update: a bearer token,
// JSON bodies, {"ok": false, "error"} refusals: not_authed, invalid_auth, channel_not_found,
// not_in_channel, no_text, msg_too_long, message_not_found, cant_update_message), rate limits
// (https://api.slack.com/apis/rate-limits: HTTP 429 with Retry-After; chat.postMessage about one
// message a second per channel, with bursts), and the Events API's side
// (https://api.slack.com/apis/events-api): event_callback envelopes signed as
// https://api.slack.com/authentication/verifying-requests-from-slack says, the url_verification
// challenge, and retries with X-Slack-Retry-Num when the app does not answer 2xx (Slack waits
// minutes between them; here a second).
import { createHmac } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";

interface Posted {
  channel: string;
  ts: string;
  user: string;
  thread_ts?: string;
  /** Every text it had, first to last. */
  versions: string[];
}

export class SlackServer {
  readonly botUser = "U0BOT0001";
  readonly team = "T0TEAM001";
  readonly messages: Posted[] = [];
  readonly refusals: string[] = [];
  /** Event deliveries: the status the app answered each (retries included). */
  readonly deliveries: { eventId: string; retry: number; status: number }[] = [];
  private readonly files = new Map<string, Buffer>();
  private readonly buckets = new Map<string, { tokens: number; atMs: number }>();
  private clock = 1_764_000_000;
  private server?: http.Server;
  base = "";

  constructor(
    readonly botToken: string,
    readonly signingSecret: string,
    /** Channels the bot is in (others: not_in_channel). */
    readonly memberOf: Set<string>,
  ) {}

  async start(): Promise<string> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => this.route(req, Buffer.concat(chunks), res));
    });
    await new Promise<void>((r) => this.server!.listen(0, "127.0.0.1", () => r()));
    this.base = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return `${this.base}/api`;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise((r) => this.server?.close(r));
  }

  /** A file a user shares; its url_private needs the bot token. */
  addFile(id: string, bytes: Buffer): string {
    this.files.set(id, bytes);
    return `${this.base}/files/${id}`;
  }

  /** A new message ts, as Slack writes them ("seconds.micros", increasing). */
  nextTs(): string {
    return `${++this.clock}.000100`;
  }

  /** Signs and POSTs a request as Slack does; `tamper` changes it after signing. */
  async post(url: string, payload: object, extra: Record<string, string> = {}, tamper?: (body: string) => string) {
    const body = JSON.stringify(payload);
    const ts = String(Math.floor(Date.now() / 1000));
    const sig = `v0=${createHmac("sha256", this.signingSecret).update(`v0:${ts}:${body}`).digest("hex")}`;
    const res = await fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-slack-request-timestamp": ts,
        "x-slack-signature": sig,
        ...extra,
      },
      body: tamper ? tamper(body) : body,
      signal: AbortSignal.timeout(3000),
    });
    return { status: res.status, body: (await res.json().catch(() => ({}))) as Record<string, unknown> };
  }

  /** The Events API's URL check: the app must answer with the challenge. */
  async verifyUrl(url: string): Promise<boolean> {
    const challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P";
    const res = await this.post(url, { token: "legacy", challenge, type: "url_verification" });
    return res.status === 200 && res.body.challenge === challenge;
  }

  /** Delivers an event as Slack does: until the app answers 2xx, three retries, a second apart. */
  async sendEvent(url: string, event: Record<string, unknown>): Promise<void> {
    const eventId = `Ev${Math.random().toString(36).slice(2, 12).toUpperCase()}`;
    const envelope = {
      token: "legacy",
      team_id: this.team,
      api_app_id: "A0APP0001",
      event,
      type: "event_callback",
      event_id: eventId,
      event_time: Math.floor(Date.now() / 1000),
      authorizations: [{ team_id: this.team, user_id: this.botUser, is_bot: true }],
    };
    for (let retry = 0; retry <= 3; retry++) {
      const headers: Record<string, string> = retry
        ? { "x-slack-retry-num": String(retry), "x-slack-retry-reason": "http_error" }
        : {};
      const status = await this.post(url, envelope, headers).then(
        (r) => r.status,
        () => 0,
      );
      this.deliveries.push({ eventId, retry, status });
      if (status >= 200 && status < 300) return;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }

  /** Answers one request (its return value is not used). */
  private route(req: http.IncomingMessage, raw: Buffer, res: http.ServerResponse): unknown {
    const json = (status: number, body: object, headers: Record<string, string> = {}) =>
      res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body));
    const url = new URL(req.url ?? "/", "http://x");
    const file = /^\/files\/(.+)$/.exec(url.pathname);
    if (file) {
      const bytes = this.files.get(file[1]!);
      if (req.headers.authorization !== `Bearer ${this.botToken}`) return void res.writeHead(403).end();
      return void (bytes
        ? res.writeHead(200, { "content-type": "application/octet-stream" }).end(bytes)
        : res.writeHead(404).end());
    }
    const m = /^\/api\/([a-zA-Z.]+)$/.exec(url.pathname);
    if (!m) return json(404, { ok: false, error: "unknown_method" });
    const refuse = (error: string) => {
      this.refusals.push(`${m[1]}: ${error}`);
      return json(200, { ok: false, error });
    };
    const auth = req.headers.authorization;
    if (!auth) return refuse("not_authed");
    if (auth !== `Bearer ${this.botToken}`) return refuse("invalid_auth");
    let p: Record<string, unknown> = {};
    try {
      if (raw.length > 0) p = JSON.parse(raw.toString("utf8"));
    } catch {
      return refuse("invalid_json");
    }
    switch (m[1]) {
      case "auth.test":
        return json(200, {
          ok: true,
          url: "https://team.slack.com/",
          team_id: this.team,
          user_id: this.botUser,
          bot_id: "B0BOT0001",
        });
      case "chat.postMessage": {
        const channel = String(p.channel ?? "");
        if (!channel) return refuse("channel_not_found");
        if (!this.memberOf.has(channel)) return refuse("not_in_channel");
        const bad = this.textProblem(p.text);
        if (bad) return refuse(bad);
        const wait = this.limited(channel);
        if (wait) return json(429, { ok: false, error: "ratelimited" }, { "retry-after": String(wait) });
        const msg: Posted = {
          channel,
          ts: this.nextTs(),
          user: this.botUser,
          ...(p.thread_ts ? { thread_ts: String(p.thread_ts) } : {}),
          versions: [String(p.text)],
        };
        this.messages.push(msg);
        return json(200, {
          ok: true,
          channel,
          ts: msg.ts,
          message: { type: "message", user: msg.user, text: p.text, ts: msg.ts },
        });
      }
      case "chat.update": {
        const msg = this.messages.find((x) => x.channel === p.channel && x.ts === p.ts);
        if (!msg) return refuse("message_not_found");
        if (msg.user !== this.botUser) return refuse("cant_update_message");
        const bad = this.textProblem(p.text);
        if (bad) return refuse(bad);
        msg.versions.push(String(p.text));
        return json(200, { ok: true, channel: msg.channel, ts: msg.ts, text: p.text });
      }
      default:
        return refuse("unknown_method");
    }
  }

  private textProblem(text: unknown): string | undefined {
    if (typeof text !== "string" || text.trim() === "") return "no_text";
    if (text.length > 40_000) return "msg_too_long";
    return undefined;
  }

  /** chat.postMessage's limit: a burst of 3 per channel, then one a second; the seconds to wait, or 0. */
  private limited(channel: string): number {
    const now = Date.now();
    const b = this.buckets.get(channel) ?? { tokens: 3, atMs: now };
    this.buckets.set(channel, b);
    b.tokens = Math.min(3, b.tokens + (now - b.atMs) / 1000);
    b.atMs = now;
    if (b.tokens < 1) return Math.ceil(1 - b.tokens);
    b.tokens -= 1;
    return 0;
  }

  /** The bot's messages in a channel (or a thread), oldest first. */
  botMessages(channel: string, thread?: string): Posted[] {
    return this.messages.filter((x) => x.channel === channel && (thread === undefined || x.thread_ts === thread));
  }
}
