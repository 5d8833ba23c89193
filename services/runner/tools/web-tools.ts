// The agent's reach beyond its sandbox: `web_fetch` (read a public page as text) and
// `http_request` (call an API the operator allowed, with secrets the model never sees). Both go
// through the SSRF guard (shared/net/net-guard.ts); a refusal is a tool error that says why, and
// nothing from a refused address reaches the model.
import type { convert as Convert } from "html-to-text";
import { lazyModule } from "../../shared/process/lazy-module.js";

/** Loaded by the first page fetched. */
const htmlConverter = lazyModule<{ convert: typeof Convert }>("html-to-text");
import {
  guardedRequest,
  hostMatches,
  NetRefusal,
  type GuardedResponse,
  type NetPolicy,
} from "../../shared/net/net-guard.js";
import { ReloadingFile } from "../../shared/config/reloading-file.js";
import type { AgentConfig } from "../agent-config.js";
import { clip, MAX_RESULT_CHARS, type Tool, type ToolResult } from "./tools.js";

/** Bytes of a page or response read at most; the rest is not downloaded. */
const MAX_BODY_BYTES = 2 * 1024 * 1024;
const FETCH_TIMEOUT_MS = 20_000;
const HTML = new Set(["text/html", "application/xhtml+xml"]);
const TEXT = new Set([
  "text/plain",
  "text/markdown",
  "text/csv",
  "text/xml",
  "application/json",
  "application/ld+json",
  "application/xml",
  "application/rss+xml",
  "application/atom+xml",
  "application/problem+json",
]);

const mediaType = (res: GuardedResponse) =>
  String(res.headers["content-type"] ?? "")
    .split(";")[0]
    .trim()
    .toLowerCase();

/** The body as text in the charset the response names (UTF-8 when it names none or one we lack). */
function decode(res: GuardedResponse): string {
  const charset = /charset="?([\w-]+)/i.exec(String(res.headers["content-type"] ?? ""))?.[1] ?? "utf-8";
  try {
    return new TextDecoder(charset).decode(res.body);
  } catch {
    return new TextDecoder("utf-8").decode(res.body);
  }
}

/** Readable text of an HTML page: headings, paragraphs, lists, tables and links; no scripts or images. */
export function htmlToText(html: string): string {
  return htmlConverter()
    .convert(html, {
      wordwrap: false,
      selectors: [
        { selector: "img", format: "skip" },
        { selector: "a", options: { hideLinkHrefIfSameAsText: true, linkBrackets: ["<", ">"] } },
        { selector: "h1", options: { uppercase: false } },
        { selector: "h2", options: { uppercase: false } },
        { selector: "h3", options: { uppercase: false } },
        { selector: "table", format: "dataTable" },
      ],
    })
    .trim();
}

const failure = (tool: string, err: unknown): ToolResult => ({
  output:
    err instanceof NetRefusal
      ? `${tool} refused: ${err.message}`
      : `${tool} failed: ${(err as { cause?: Error }).cause?.message ?? (err as Error).message}`,
  isError: true,
});

/** `web_fetch`: GET a public http(s) page and return its readable text. */
export function webFetchTool(policy: NetPolicy, agent: () => Promise<AgentConfig>): Tool {
  return {
    name: "web_fetch",
    parallel: true,
    description:
      "Fetch a public web page (http or https) and return its readable text, with the final URL and status. Private and local addresses are refused.",
    parameters: {
      type: "object",
      properties: {
        url: { type: "string", description: "An http:// or https:// URL." },
        max_chars: {
          type: "integer",
          minimum: 100,
          maximum: MAX_RESULT_CHARS,
          description: "Characters of text returned (default 12000).",
        },
      },
      required: ["url"],
      additionalProperties: false,
    },
    async execute(args, ctx) {
      if (typeof args.url !== "string" || args.url.trim() === "")
        return { output: "web_fetch: `url` must be an http(s) URL", isError: true };
      if (!(await agent()).webFetch)
        return { output: "web_fetch is turned off for this agent (agent.json webFetch)", isError: true };
      const maxChars =
        typeof args.max_chars === "number" ? Math.max(100, Math.min(MAX_RESULT_CHARS, args.max_chars)) : 12_000;
      let res: GuardedResponse;
      try {
        res = await guardedRequest(
          args.url.trim(),
          {
            headers: () => ({ "user-agent": "Troupe-web_fetch/1", accept: "text/html, text/plain;q=0.9, */*;q=0.5" }),
            maxBytes: MAX_BODY_BYTES,
            timeoutMs: FETCH_TIMEOUT_MS,
            signal: ctx.signal,
          },
          policy,
        );
      } catch (err) {
        return failure("web_fetch", err);
      }
      const type = mediaType(res);
      const head = [`URL: ${res.url.href}`, `Status: ${res.status}`, `Content-Type: ${type || "(none)"}`];
      if (res.redirectedFrom.length > 0) head.push(`Redirected from: ${res.redirectedFrom.join(" -> ")}`);
      if (!HTML.has(type) && !TEXT.has(type) && !type.startsWith("text/")) {
        head.push(
          "",
          `web_fetch reads text and HTML only; this is ${type || "of no stated type"} (${res.body.length}${res.truncated ? "+" : ""} bytes, not shown)`,
        );
        return { output: head.join("\n"), isError: true };
      }
      const text = HTML.has(type) ? htmlToText(decode(res)) : decode(res);
      const cut = text.length > maxChars;
      head.push(
        `Truncated: ${
          res.truncated
            ? `yes (the page is over ${MAX_BODY_BYTES} bytes; only its start was read)`
            : cut
              ? `yes (${text.length} characters; the first ${maxChars} are shown)`
              : "no"
        }`,
      );
      return { output: `${head.join("\n")}\n\n${cut ? text.slice(0, maxChars) : text}`, isError: res.status >= 400 };
    },
  };
}

const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
/** Headers the HTTP client sets itself, or that would let a call escape its host. */
const FORBIDDEN_HEADERS = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "upgrade",
  "te",
  "trailer",
  "expect",
  "proxy-authorization",
  "proxy-connection",
]);
const SECRET_REF = /\{\{secret:([A-Z][A-Z0-9_]{0,63})\}\}/g;

/** The secrets file: {"NAME": "value"}, read again when it changes. */
export class Secrets {
  private readonly file: ReloadingFile<Record<string, string>>;
  constructor(path: string) {
    this.file = new ReloadingFile(
      path,
      (text, source) => {
        const o = JSON.parse(text) as unknown;
        if (typeof o !== "object" || o === null || Object.values(o).some((v) => typeof v !== "string"))
          throw new Error(`${source}: must be a JSON object of names to string values`);
        return o as Record<string, string>;
      },
      {},
    );
  }
  async all(): Promise<Record<string, string>> {
    await this.file.reload();
    return this.file.value;
  }
}

/** `http_request`: an API call to a host the agent's configuration allows. */
export function httpRequestTool(policy: NetPolicy, agent: () => Promise<AgentConfig>, secrets: Secrets): Tool {
  return {
    name: "http_request",
    description:
      "Call an HTTP API on a host this agent is allowed to reach. Put a configured secret in a header as {{secret:NAME}}; its value is filled in by the runtime and never shown.",
    parameters: {
      type: "object",
      properties: {
        method: { type: "string", enum: METHODS },
        url: { type: "string" },
        headers: { type: "object", additionalProperties: { type: "string" } },
        json: { description: "A JSON body (sent as application/json)." },
        body: { type: "string", description: "A text body (instead of json)." },
      },
      required: ["method", "url"],
      additionalProperties: false,
    },
    async execute(args, ctx) {
      const method = String(args.method ?? "").toUpperCase();
      if (!METHODS.includes(method))
        return { output: `http_request: method must be one of ${METHODS.join(", ")}`, isError: true };
      if (typeof args.url !== "string") return { output: "http_request: `url` must be a string", isError: true };
      if (args.json !== undefined && args.body !== undefined)
        return { output: "http_request: send `json` or `body`, not both", isError: true };
      const { http } = await agent();
      if (http.allowHosts.length === 0)
        return {
          output:
            "http_request: this agent may not call any host (an operator lists them in agent.json http.allowHosts)",
          isError: true,
        };
      const given = (args.headers ?? {}) as Record<string, unknown>;
      for (const [k, v] of Object.entries(given)) {
        if (typeof v !== "string") return { output: `http_request: header ${k} must be a string`, isError: true };
        if (FORBIDDEN_HEADERS.has(k.toLowerCase()))
          return { output: `http_request: header ${k} is set by the runtime, not by a call`, isError: true };
      }
      let values: Record<string, string>;
      try {
        values = await secrets.all();
      } catch (err) {
        return { output: `http_request: the secrets file cannot be read: ${(err as Error).message}`, isError: true };
      }
      const body = args.json !== undefined ? JSON.stringify(args.json) : (args.body as string | undefined);
      const headersFor = (url: URL): Record<string, string> => {
        const out: Record<string, string> = {};
        if (args.json !== undefined) out["content-type"] = "application/json";
        for (const [k, v] of Object.entries(given as Record<string, string>))
          out[k.toLowerCase()] = v.replace(SECRET_REF, (_, name: string) => {
            if (!hostMatches(url.hostname, http.secrets[name] ?? []))
              throw new NetRefusal(`secret ${name} may not be sent to ${url.hostname}`);
            const value = values[name];
            if (value === undefined) throw new NetRefusal(`secret ${name} is not configured on this runner`);
            return value;
          });
        return out;
      };
      let res: GuardedResponse;
      try {
        res = await guardedRequest(
          args.url,
          {
            method,
            headers: headersFor,
            body,
            checkHop: (url) => {
              if (!hostMatches(url.hostname, http.allowHosts))
                throw new NetRefusal(`${url.hostname} is not among this agent's allowed hosts`);
            },
            maxBytes: MAX_BODY_BYTES,
            timeoutMs: FETCH_TIMEOUT_MS,
            signal: ctx.signal,
          },
          policy,
        );
      } catch (err) {
        return failure("http_request", err);
      }
      const type = mediaType(res);
      const textual =
        type === "" ||
        type.startsWith("text/") ||
        TEXT.has(type) ||
        type.endsWith("+json") ||
        type === "application/x-www-form-urlencoded";
      const lines = [`HTTP ${res.status}`, `content-type: ${type || "(none)"}`];
      if (res.redirectedFrom.length > 0) lines.push(`redirected from: ${res.redirectedFrom.join(" -> ")}`);
      lines.push("", textual ? decode(res) : `[${res.body.length} bytes of ${type}, not shown]`);
      if (res.truncated) lines.push(`[the body is over ${MAX_BODY_BYTES} bytes; only its start was read]`);
      // A server that echoes a secret back does not hand it to the model.
      let output = lines.join("\n");
      for (const [name, value] of Object.entries(values))
        if (value.length >= 4) output = output.split(value).join(`[secret ${name}]`);
      return { output: clip(output), isError: res.status >= 400 };
    },
  };
}
