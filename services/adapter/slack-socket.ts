// Slack's Socket Mode (https://api.slack.com/apis/connections/socket-implement): events come over
// a WebSocket the adapter opens, so it needs no public URL. apps.connections.open, called with an
// app-level token (xapp-, scope connections:write), gives a single-use wss URL; Slack says `hello`
// on it, then sends envelopes {envelope_id, type, payload, retry_attempt, retry_reason}. Each is
// acknowledged by sending {"envelope_id"} back on the same socket; one not acknowledged within
// three seconds is sent again. Slack recycles connections: a `disconnect` message (reason
// `warning` or `refresh_requested`) comes shortly before it closes one, and the app should have a
// new one open by then; `link_disabled` means Socket Mode was turned off for the app.
//
// Here an envelope is acknowledged only once its event was handled (delivered to the gateway), as
// the HTTP side answers 200 only then: an event the gateway did not take is sent again by Slack,
// and what it sends twice is one message (the idempotency key). A replacement connection is opened
// on `disconnect`, before the old one closes, so nothing sent in between is lost; a socket that
// closes without notice is replaced with a backoff of 1 s doubling to 30 s. Node's WebSocket
// cannot send a ping, so a connection that went silent without closing (a NAT that forgot it)
// would not be noticed: each connection is replaced the same way after `refreshMs`, which bounds
// how long the adapter can be deaf. An envelope whose acknowledgement the replaced socket can no
// longer carry is sent again by Slack and taken once.
import type { Logger } from "../shared/process/log.js";
import { SlackApi, SlackApiError } from "./slack-api.js";

/** What an events_api envelope's handling came to: acknowledge it, or leave it for Slack to send again. */
export type EnvelopeOutcome = "ack" | "retry";

export interface SocketModeOptions {
  apiUrl: string;
  appToken: string;
  logger: Logger;
  /** Handles one interactive envelope's payload (a button's click). Contract: never throws. */
  onInteractive?(payload: unknown): Promise<void>;
  /** Handles one events_api envelope's payload (an event_callback). Contract: never throws. */
  onEvents(payload: unknown, retryAttempt: number): Promise<EnvelopeOutcome>;
  /** How long one connection is kept before it is replaced by a new one (0: until Slack closes it). */
  refreshMs: number;
}

interface Envelope {
  type?: string;
  envelope_id?: string;
  payload?: unknown;
  reason?: string;
  retry_attempt?: number;
}

const FIRST_BACKOFF_MS = 1000;
const MAX_BACKOFF_MS = 30_000;
/** How long a socket we replaced stays open for the acknowledgements of what it is handling (Slack waits 3 s). */
const REPLACED_GRACE_MS = 3000;
/** A connection Slack has not said hello on by then is given up (a handshake or a hello that never comes). */
const HELLO_TIMEOUT_MS = 10_000;

export class SocketModeClient {
  private readonly api: SlackApi;
  private current?: WebSocket;
  private readonly sockets = new Set<WebSocket>();
  private readonly handling = new Set<Promise<void>>();
  private backoffMs = FIRST_BACKOFF_MS;
  private retryTimer?: NodeJS.Timeout;
  private refreshTimer?: NodeJS.Timeout;
  /** A socket replaced by our own refresh (not Slack's notice): closed once the next says hello. */
  private refreshed?: WebSocket;
  private closed = false;

  constructor(private readonly opts: SocketModeOptions) {
    this.api = new SlackApi(opts.apiUrl, opts.appToken);
  }

  /** Opens the first connection; resolves at Slack's hello, rejects if Slack refuses the token. */
  async start(): Promise<void> {
    await this.connect();
  }

  /** Closes every socket and waits for the envelopes being handled. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.refreshTimer);
    for (const ws of this.sockets) ws.close(1000, "adapter stopping");
    await Promise.allSettled([...this.handling]);
  }

  /** One connection: a fresh URL, a socket, and Slack's hello on it. */
  private async connect(): Promise<void> {
    const { url } = await this.api.call<{ url: string }>("apps.connections.open", {}).catch((err: unknown) => {
      if (err instanceof SlackApiError && ["invalid_auth", "not_authed", "not_allowed_token_type"].includes(err.error))
        throw new Error(
          `Slack refused SLACK_APP_TOKEN (${err.error}): it must be an app-level token (xapp-...) with connections:write`,
        );
      throw err;
    });
    const ws = new WebSocket(url);
    this.sockets.add(ws);
    await new Promise<void>((resolve, reject) => {
      let greeted = false;
      const timer = setTimeout(() => {
        this.sockets.delete(ws);
        ws.close();
        reject(new Error(`Slack said no hello on the Socket Mode connection within ${HELLO_TIMEOUT_MS} ms`));
      }, HELLO_TIMEOUT_MS);
      ws.addEventListener("message", (m) => {
        const env = parse(m.data);
        if (env?.type === "hello" && !greeted) {
          greeted = true;
          clearTimeout(timer);
          this.greeted(ws);
          resolve();
        } else if (env) this.receive(ws, env);
      });
      ws.addEventListener("close", (e) => {
        this.sockets.delete(ws);
        clearTimeout(timer);
        if (!greeted)
          reject(new Error(`the Socket Mode connection closed before Slack's hello (${e.code} ${e.reason})`));
        else if (ws === this.current && !this.closed) {
          this.opts.logger.warn("the Socket Mode connection closed without notice; reconnecting", { code: e.code });
          this.current = undefined;
          this.reconnectLater();
        }
      });
      // An error is followed by a close, which settles the connection.
      ws.addEventListener("error", () => undefined);
    });
  }

  /** A connection Slack said hello on becomes the one in use; the one it replaced by refresh goes. */
  private greeted(ws: WebSocket): void {
    if (this.closed) return void ws.close(1000, "adapter stopping");
    this.current = ws;
    this.backoffMs = FIRST_BACKOFF_MS;
    const old = this.refreshed;
    this.refreshed = undefined;
    if (old) setTimeout(() => old.close(1000, "replaced by a newer connection"), REPLACED_GRACE_MS).unref();
    clearTimeout(this.refreshTimer);
    if (this.opts.refreshMs > 0) {
      this.refreshTimer = setTimeout(() => {
        if (this.current !== ws || this.closed) return;
        this.refreshed = ws;
        this.current = undefined;
        this.replace();
      }, this.opts.refreshMs);
      this.refreshTimer.unref();
    }
  }

  private receive(ws: WebSocket, env: Envelope): void {
    if (env.type === "disconnect") {
      // Slack closes this socket soon; the next one is opened now so that nothing falls between.
      const log = env.reason === "link_disabled" ? this.opts.logger.error : this.opts.logger.info;
      log.call(this.opts.logger, "Slack is closing the Socket Mode connection; opening another", {
        reason: env.reason ?? "",
      });
      if (ws !== this.current) return;
      this.current = undefined;
      if (!this.closed) this.replace();
      return;
    }
    if (!env.envelope_id) return;
    const id = env.envelope_id;
    const ack = () => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ envelope_id: id }));
    };
    // Events and button clicks are served; slash commands are acknowledged and left, so that
    // Slack does not send them again.
    if (env.type === "interactive" && this.opts.onInteractive) {
      const done = this.opts
        .onInteractive(env.payload)
        .then(ack)
        .finally(() => this.handling.delete(done));
      this.handling.add(done);
      return;
    }
    if (env.type !== "events_api") {
      ack();
      return;
    }
    const done = this.opts
      .onEvents(env.payload, env.retry_attempt ?? 0)
      .then((outcome) => {
        if (outcome === "ack") ack();
      })
      .finally(() => this.handling.delete(done));
    this.handling.add(done);
  }

  private replace(): void {
    this.connect().catch((err: unknown) => {
      this.opts.logger.warn("a Socket Mode connection could not be opened; trying again", { error: String(err) });
      this.reconnectLater();
    });
  }

  private reconnectLater(): void {
    if (this.closed || this.retryTimer) return;
    const wait = this.backoffMs;
    this.backoffMs = Math.min(MAX_BACKOFF_MS, this.backoffMs * 2);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      if (!this.closed && !this.current) this.replace();
    }, wait);
  }
}

function parse(data: unknown): Envelope | undefined {
  if (typeof data !== "string") return undefined;
  try {
    const v = JSON.parse(data) as unknown;
    return v && typeof v === "object" ? (v as Envelope) : undefined;
  } catch {
    return undefined;
  }
}
