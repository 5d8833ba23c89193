// Slack for tests, written from its published references: the Web API methods an adapter calls
// (https://api.slack.com/methods/auth.test, /chat.postMessage, /chat.update: a bearer token,
// JSON bodies, {"ok": false, "error"} refusals: not_authed, invalid_auth, channel_not_found,
// not_in_channel, no_text, msg_too_long, message_not_found, cant_update_message), rate limits
// (https://api.slack.com/apis/rate-limits: HTTP 429 with Retry-After; chat.postMessage about one
// message a second per channel, with bursts), and the Events API's side
// (https://api.slack.com/apis/events-api): event_callback envelopes signed as
// https://api.slack.com/authentication/verifying-requests-from-slack says, the url_verification
// challenge, and retries with X-Slack-Retry-Num when the app does not answer 2xx (Slack waits
// minutes between them; here a second). Socket Mode
// (https://api.slack.com/apis/connections/socket-implement, /methods/apps.connections.open): the
// URL is asked for with an app-level token (a bot token is not_allowed_token_type) and takes one
// connection; Slack says hello, sends events_api envelopes and sends one again (retry_attempt,
// retry_reason "timeout") when no {"envelope_id"} comes back on that socket within 3 s; it recycles
// a connection with a `disconnect` message before closing it. Block Kit
// (https://api.slack.com/reference/block-kit/blocks): section and actions blocks, buttons with a
// plain_text label of at most 75 characters, an action_id of at most 255 unique in its block, a
// value of at most 2,000 (invalid_blocks otherwise); a click as a block_actions interaction
// (https://api.slack.com/reference/interaction-payloads/block-actions), POSTed form-encoded as
// payload=<json> and signed like events; chat.postEphemeral.
import { createHmac, randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { acceptWebSocket, type ServerSocket } from "./websocket-server.js";

interface Posted {
  channel: string;
  ts: string;
  user: string;
  thread_ts?: string;
  /** Every text it had, first to last. */
  versions: string[];
  blocks?: Block[];
}

type Block = { type: string; text?: { type: string; text: string }; elements?: Button[] };
type Button = { type: string; text?: { type: string; text: string }; action_id?: string; value?: string };

export class SlackServer {
  readonly botUser = "U0BOT0001";
  readonly team = "T0TEAM001";
  readonly messages: Posted[] = [];
  readonly refusals: string[] = [];
  /** chat.postEphemeral's messages: seen by one user only. */
  readonly ephemerals: { channel: string; user: string; text: string }[] = [];
  /** Event deliveries: the status the app answered each (retries included). */
  readonly deliveries: { eventId: string; retry: number; status: number }[] = [];
  private readonly files = new Map<string, Buffer>();
  private readonly buckets = new Map<string, { tokens: number; atMs: number }>();
  private clock = 1_764_000_000;
  private server?: http.Server;
  base = "";
  readonly appToken = "xapp-1-A0APP0001-1764000000-test";
  /** Socket Mode: URLs given and not yet used, the connections that said hello, what was sent on them. */
  private readonly tickets = new Set<string>();
  readonly sockets: ServerSocket[] = [];
  readonly socketDeliveries: { envelopeId: string; retry: number; acked: boolean }[] = [];
  private readonly acks = new Map<string, () => void>();
  connectionsOpened = 0;
  /** Connections still to come on which Slack will say no hello (a fault on its side). */
  withholdHello = 0;

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
    this.server.on("upgrade", (req, socket) => this.upgrade(req, socket));
    await new Promise<void>((r) => this.server!.listen(0, "127.0.0.1", () => r()));
    this.base = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return `${this.base}/api`;
  }

  async stop(): Promise<void> {
    for (const s of this.sockets) s.close(1001, "", true);
    this.server?.closeAllConnections();
    await new Promise((r) => this.server?.close(r));
  }

  /** How long the next file download waits before its bytes come (a slow or large file); once. */
  fileDelayMs = 0;

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

  /** A user clicks a button of a bot message: the block_actions interaction, signed, form-encoded. */
  async click(url: string, by: { user: string; channel: string; message: Posted; actionId: string }) {
    const payload = this.clickPayload(by);
    const body = new URLSearchParams({ payload: JSON.stringify(payload) }).toString();
    const ts = String(Math.floor(Date.now() / 1000));
    const sig = `v0=${createHmac("sha256", this.signingSecret).update(`v0:${ts}:${body}`).digest("hex")}`;
    const res = await fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": ts,
        "x-slack-signature": sig,
      },
      body,
      signal: AbortSignal.timeout(3000),
    });
    await res.arrayBuffer();
    return res.status;
  }

  /** The same click by Socket Mode: an `interactive` envelope; resolves to whether it was acknowledged within 3 s. */
  async clickBySocket(by: { user: string; channel: string; message: Posted; actionId: string }): Promise<boolean> {
    const socket = this.liveSocket();
    if (!socket) return false;
    const envelopeId = randomUUID();
    const acked = new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), 3000);
      this.acks.set(envelopeId, () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    socket.sendText(
      JSON.stringify({
        envelope_id: envelopeId,
        payload: this.clickPayload(by),
        type: "interactive",
        accepts_response_payload: true,
      }),
    );
    const ok = await acked;
    this.acks.delete(envelopeId);
    return ok;
  }

  private clickPayload(by: { user: string; channel: string; message: Posted; actionId: string }) {
    const action = by.message.blocks?.flatMap((b) => b.elements ?? []).find((e) => e.action_id === by.actionId);
    const payload = {
      type: "block_actions",
      user: { id: by.user, team_id: this.team },
      team: { id: this.team },
      api_app_id: "A0APP0001",
      container: { type: "message", message_ts: by.message.ts, channel_id: by.channel },
      channel: { id: by.channel },
      message: { type: "message", ts: by.message.ts, text: by.message.versions.at(-1), blocks: by.message.blocks },
      trigger_id: randomUUID(),
      response_url: `${this.base}/actions/${randomUUID()}`,
      actions: [
        {
          type: "button",
          action_id: by.actionId,
          block_id: "b1",
          value: action?.value,
          text: action?.text,
          action_ts: String(Date.now() / 1000),
        },
      ],
    };
    return payload;
  }

  /** The Events API's URL check: the app must answer with the challenge. */
  async verifyUrl(url: string): Promise<boolean> {
    const challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P";
    const res = await this.post(url, { token: "legacy", challenge, type: "url_verification" });
    return res.status === 200 && res.body.challenge === challenge;
  }

  /** The Events API's envelope around an event. */
  private callback(event: Record<string, unknown>) {
    return {
      token: "legacy",
      team_id: this.team,
      api_app_id: "A0APP0001",
      event,
      type: "event_callback",
      event_id: `Ev${Math.random().toString(36).slice(2, 12).toUpperCase()}`,
      event_time: Math.floor(Date.now() / 1000),
      authorizations: [{ team_id: this.team, user_id: this.botUser, is_bot: true }],
    };
  }

  /** Delivers an event as Slack does: until the app answers 2xx, three retries, a second apart. */
  async sendEvent(url: string, event: Record<string, unknown>): Promise<void> {
    const envelope = this.callback(event);
    const eventId = envelope.event_id;
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

  /** The newest Socket Mode connection still open (Slack picks one; here the newest). */
  liveSocket(): ServerSocket | undefined {
    return this.sockets.filter((s) => !s.closed).at(-1);
  }

  /**
   * Sends an event by Socket Mode as Slack does: until it is acknowledged within 3 s, three more
   * times (retry_reason "timeout"), each on the newest open connection unless `via` is given.
   * Resolves to whether it was acknowledged.
   */
  async sendSocketEvent(event: Record<string, unknown>, via?: ServerSocket): Promise<boolean> {
    const payload = this.callback(event);
    for (let retry = 0; retry <= 3; retry++) {
      const socket = retry === 0 && via ? via : this.liveSocket();
      const envelopeId = randomUUID();
      const acked = new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), 3000);
        this.acks.set(envelopeId, () => {
          clearTimeout(timer);
          resolve(true);
        });
      });
      socket?.sendText(
        JSON.stringify({
          envelope_id: envelopeId,
          payload,
          type: "events_api",
          accepts_response_payload: false,
          retry_attempt: retry,
          retry_reason: retry ? "timeout" : "",
        }),
      );
      const ok = socket ? await acked : false;
      this.acks.delete(envelopeId);
      this.socketDeliveries.push({ envelopeId, retry, acked: ok });
      if (ok) return true;
      if (!socket) await new Promise((r) => setTimeout(r, 1000));
    }
    return false;
  }

  /** Recycles every connection as Slack does: a `disconnect` message, then the close `afterMs` later. */
  recycle(reason = "refresh_requested", afterMs = 1500): void {
    for (const s of this.sockets.filter((x) => !x.closed)) {
      s.sendText(JSON.stringify({ type: "disconnect", reason, debug_info: { host: "applink-test" } }));
      setTimeout(() => s.close(1000, "recycled"), afterMs).unref();
    }
  }

  /** Cuts every connection with no notice (a network fault). */
  cutSockets(): void {
    for (const s of this.sockets) s.close(1006, "", true);
  }

  /** A Socket Mode connection: one per URL given by apps.connections.open, then hello. */
  private upgrade(req: http.IncomingMessage, socket: import("node:stream").Duplex): void {
    const url = new URL(req.url ?? "/", "http://x");
    const ticket = url.searchParams.get("ticket") ?? "";
    const known = url.pathname === "/link/" && this.tickets.delete(ticket);
    const ws = acceptWebSocket(req, socket, known ? undefined : 401);
    if (!ws) return;
    this.sockets.push(ws);
    ws.onText = (text) => {
      let m: { envelope_id?: unknown };
      try {
        m = JSON.parse(text);
      } catch {
        return ws.close(1007, "not JSON");
      }
      if (typeof m.envelope_id === "string") this.acks.get(m.envelope_id)?.();
    };
    if (this.withholdHello > 0) {
      this.withholdHello--;
      return;
    }
    ws.sendText(
      JSON.stringify({
        type: "hello",
        num_connections: this.sockets.filter((s) => !s.closed).length,
        debug_info: { host: "applink-test", build_number: 1, approximate_connection_time: 18060 },
        connection_info: { app_id: "A0APP0001" },
      }),
    );
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
      const answer = () =>
        bytes
          ? res.writeHead(200, { "content-type": "application/octet-stream" }).end(bytes)
          : res.writeHead(404).end();
      const delay = this.fileDelayMs;
      this.fileDelayMs = 0;
      return void (delay > 0 ? setTimeout(answer, delay) : answer());
    }
    const m = /^\/api\/([a-zA-Z.]+)$/.exec(url.pathname);
    if (!m) return json(404, { ok: false, error: "unknown_method" });
    const refuse = (error: string) => {
      this.refusals.push(`${m[1]}: ${error}`);
      return json(200, { ok: false, error });
    };
    const auth = req.headers.authorization;
    if (!auth) return refuse("not_authed");
    if (m[1] === "apps.connections.open") {
      // Only an app-level token opens a connection.
      if (auth === `Bearer ${this.botToken}`) return refuse("not_allowed_token_type");
      if (auth !== `Bearer ${this.appToken}`) return refuse("invalid_auth");
      const ticket = randomUUID();
      this.tickets.add(ticket);
      this.connectionsOpened++;
      return json(200, {
        ok: true,
        url: `${this.base.replace(/^http/, "ws")}/link/?ticket=${ticket}&app_id=A0APP0001`,
      });
    }
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
        if (p.blocks !== undefined && !this.validBlocks(p.blocks)) return refuse("invalid_blocks");
        const wait = this.limited(channel);
        if (wait) return json(429, { ok: false, error: "ratelimited" }, { "retry-after": String(wait) });
        const msg: Posted = {
          ...(p.blocks ? { blocks: p.blocks as Block[] } : {}),
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
        if (p.blocks !== undefined && !this.validBlocks(p.blocks)) return refuse("invalid_blocks");
        if (p.blocks !== undefined) msg.blocks = p.blocks as Block[];
        msg.versions.push(String(p.text));
        return json(200, { ok: true, channel: msg.channel, ts: msg.ts, text: p.text });
      }
      case "chat.postEphemeral": {
        const channel = String(p.channel ?? "");
        if (!this.memberOf.has(channel)) return refuse("channel_not_found");
        if (typeof p.user !== "string" || p.user === "") return refuse("user_not_in_channel");
        const bad = this.textProblem(p.text);
        if (bad) return refuse(bad);
        this.ephemerals.push({ channel, user: p.user, text: String(p.text) });
        return json(200, { ok: true, message_ts: this.nextTs() });
      }
      default:
        return refuse("unknown_method");
    }
  }

  /** Block Kit's rules for the blocks an adapter sends (section, actions of buttons). */
  private validBlocks(blocks: unknown): boolean {
    if (!Array.isArray(blocks) || blocks.length > 50) return false;
    for (const b of blocks as Block[]) {
      if (b?.type === "section") {
        if (!b.text || !["mrkdwn", "plain_text"].includes(b.text.type) || b.text.text.length > 3000) return false;
      } else if (b?.type === "actions") {
        const els = b.elements ?? [];
        if (els.length === 0 || els.length > 25) return false;
        const ids = new Set<string>();
        for (const e of els) {
          if (e.type !== "button" || e.text?.type !== "plain_text" || !e.text.text || e.text.text.length > 75)
            return false;
          if (!e.action_id || e.action_id.length > 255 || ids.has(e.action_id)) return false;
          ids.add(e.action_id);
          if ((e.value ?? "").length > 2000) return false;
        }
      } else return false;
    }
    return true;
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
