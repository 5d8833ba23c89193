// A small client of Slack's Web API (https://api.slack.com/web): POST https://slack.com/api/<method>
// with a JSON body and the bot token as a bearer; the answer is {"ok": true, ...} or {"ok": false,
// "error": "..."}; a rate limit is HTTP 429 with Retry-After in seconds
// (https://api.slack.com/apis/rate-limits). Only what the adapter uses.
import { discardBody, downloadUpTo, jsonUpTo } from "../shared/net/bounded-body.js";

/** The longest Web API answer read: Slack's are a few kilobytes. */
const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

export class SlackApiError extends Error {
  constructor(
    readonly error: string,
    readonly status: number,
    readonly retryAfterS?: number,
  ) {
    super(`Slack API: ${error}`);
  }
}

export class SlackApi {
  constructor(
    private readonly apiUrl: string,
    private readonly token: string,
  ) {}

  async call<T extends object>(method: string, params: object): Promise<T> {
    const res = await fetch(`${this.apiUrl.replace(/\/$/, "")}/${method}`, {
      method: "POST",
      headers: { "content-type": "application/json; charset=utf-8", authorization: `Bearer ${this.token}` },
      body: JSON.stringify(params),
      signal: AbortSignal.timeout(15_000),
    });
    if (res.status === 429) {
      await discardBody(res);
      throw new SlackApiError("ratelimited", 429, Number(res.headers.get("retry-after")) || 1);
    }
    let body: { ok?: boolean; error?: string };
    try {
      body = (await jsonUpTo(res, MAX_ANSWER_BYTES)) as typeof body;
    } catch {
      throw new SlackApiError(`not a Web API answer (HTTP ${res.status})`, res.status);
    }
    if (body.ok === true) return body as T;
    throw new SlackApiError(body.error ?? "unknown_error", res.status);
  }

  /** A file's bytes from its url_private, which needs the bot token (https://api.slack.com/types/file). */
  async download(url: string, maxBytes: number): Promise<Uint8Array> {
    const init = { headers: { authorization: `Bearer ${this.token}` }, signal: AbortSignal.timeout(15_000) };
    return downloadUpTo(url, init, maxBytes);
  }
}
