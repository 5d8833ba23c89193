// One MCP server as one session's runs use it: the SDK's client over a transport (Streamable HTTP
// through the SSRF guard, or stdio in the sandbox), its tools listed at connect and again on
// notifications/tools/list_changed, and each call bounded: a deadline (progress restarts it, up to
// a total), an abort that sends notifications/cancelled, an answer of at most 10 MB. A server that
// fails costs the call a tool error; a connection that ended is made again on the next use, after
// a backoff that doubles while it keeps failing (1 s to 60 s).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { CallToolResult, Tool as McpTool } from "@modelcontextprotocol/sdk/types.js";
import { create } from "@bufbuild/protobuf";
import { Ajv } from "ajv";
import { type Image, ImageSchema } from "../../../shared/gen/troupe/v1/session_pb.js";
import { MAX_IMAGE_BYTES, MAX_IMAGES, sniffImage } from "../../../shared/media.js";
import { clip, type ToolContext, type ToolResult } from "../tools.js";

export type McpState = "connecting" | "ready" | "failed" | "closed";

/** A tool the server offers, as the loop will see it, or why it is not offered. */
export interface McpToolEntry {
  /** `<server>__<tool>`. */
  name: string;
  /** The server's own name for it. */
  remote: string;
  description: string;
  parameters: Record<string, unknown>;
  readOnly: boolean;
  refused?: string;
}

const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;
const DEFAULT_CALL_TIMEOUT_MS = 60_000;
const CONNECT_TIMEOUT_MS = 15_000;
const BACKOFF_MIN_MS = 1000;
const BACKOFF_MAX_MS = 60_000;
/** Tools kept from one server; a server listing more is cut (each costs tokens in every model call). */
const MAX_TOOLS = 128;
/** Progress updates passed on per call per second; the rest are dropped (a flood costs nothing). */
const PROGRESS_PER_SECOND = 10;

const ajv = new Ajv({ strict: false, logger: false });

export class McpConnection {
  state: McpState = "closed";
  tools: McpToolEntry[] = [];
  /** Why the last attempt failed, or the connection ended. */
  error = "";
  private client?: Client;
  private connecting?: Promise<void>;
  private failures = 0;
  private retryAtMs = 0;
  private readonly inFlight = new Set<AbortController>();
  lastUsedMs = Date.now();
  private retired = false;

  constructor(
    readonly server: string,
    private readonly open: () => Promise<Transport>,
    private readonly opts: { callTimeoutMs?: number; scrub: (text: string) => string; now?: () => number },
  ) {}

  private now(): number {
    return this.opts.now?.() ?? Date.now();
  }

  /** Connected and listed; throws why not (within the backoff, at once with the last failure). */
  async ready(): Promise<void> {
    this.lastUsedMs = this.now();
    if (this.state === "ready") return;
    if (this.retired)
      throw new Error("the server was reconfigured or removed; the next run uses what agent.json says now");
    if (this.connecting) return this.connecting;
    if (this.state === "failed" && this.now() < this.retryAtMs)
      throw new Error(`${this.error} (tried again in ${Math.ceil((this.retryAtMs - this.now()) / 1000)} s)`);
    this.connecting = this.connect().finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  private async connect(): Promise<void> {
    this.state = "connecting";
    const client = new Client(
      { name: "troupe", version: "0.1.0" },
      {
        capabilities: {},
        listChanged: {
          tools: {
            onChanged: (err, tools) => {
              if (err || !tools || this.client !== client) return;
              this.tools = this.entries(tools);
            },
          },
        },
      },
    );
    client.onerror = (err) => this.transportError(err);
    client.onclose = () => {
      if (this.client !== client) return;
      this.client = undefined;
      if (this.state === "ready") this.fail("the connection ended");
    };
    let transport: Transport | undefined;
    try {
      transport = await this.open();
      await client.connect(transport, { timeout: CONNECT_TIMEOUT_MS });
      const listed = await client.listTools(undefined, { timeout: CONNECT_TIMEOUT_MS });
      this.client = client;
      this.tools = this.entries(listed.tools);
      this.state = "ready";
      this.failures = 0;
      this.error = "";
    } catch (err) {
      await client.close().catch(() => undefined);
      // A process that ended at once usually said why on stderr (a stdio server in the sandbox).
      const said = (transport as { lastStderr?: string } | undefined)?.lastStderr;
      const why = `${(err as Error).message}${said ? ` (its stderr: ${said.slice(-500)})` : ""}`;
      this.fail(`cannot connect: ${this.opts.scrub(why)}`);
      throw new Error(this.error);
    }
  }

  private fail(why: string): void {
    this.state = "failed";
    this.error = why;
    this.failures++;
    this.retryAtMs = this.now() + Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** (this.failures - 1));
  }

  /** An answer too large to read fails the calls waiting on it now, rather than at their deadline. */
  private transportError(err: Error): void {
    if (!/exceeded maximum size|passed \d+ bytes/.test(err.message)) return;
    for (const c of this.inFlight) c.abort(new Error("the server's answer is over 10 MB"));
  }

  /** The server's tools as entries: names checked, schemas made usable, the unusable refused with why. */
  private entries(tools: McpTool[]): McpToolEntry[] {
    const seen = new Map<string, number>();
    for (const t of tools) seen.set(t.name, (seen.get(t.name) ?? 0) + 1);
    return tools.slice(0, MAX_TOOLS).map((t) => {
      const name = `${this.server}__${t.name}`;
      const entry: McpToolEntry = {
        name,
        remote: t.name,
        description: (t.description ?? t.title ?? "").slice(0, 2000),
        parameters: paramsOf(t.inputSchema),
        readOnly: t.annotations?.readOnlyHint === true,
      };
      if (!TOOL_NAME.test(name)) entry.refused = "its name is not 1 to 64 letters, digits, _ and -";
      else if ((seen.get(t.name) ?? 0) > 1) entry.refused = "the server lists two tools of this name";
      else
        try {
          ajv.compile(entry.parameters);
        } catch (err) {
          entry.refused = `its input schema is not a schema: ${(err as Error).message}`;
        }
      return entry;
    });
  }

  /** Calls a tool; every failure is a tool result that says what went wrong. */
  async call(remote: string, args: Record<string, unknown>, ctx: ToolContext): Promise<ToolResult> {
    const name = `${this.server}__${remote}`;
    try {
      await this.ready();
    } catch (err) {
      return {
        output: `${name}: the MCP server ${this.server} is unavailable: ${(err as Error).message}`,
        isError: true,
      };
    }
    const client = this.client!;
    const stop = new AbortController();
    const onAbort = () => stop.abort(ctx.signal.reason);
    ctx.signal.addEventListener("abort", onAbort, { once: true });
    this.inFlight.add(stop);
    const timeout = this.opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    let shown = 0;
    let second = 0;
    try {
      const result = (await client.callTool({ name: remote, arguments: args }, undefined, {
        signal: stop.signal,
        timeout,
        resetTimeoutOnProgress: true,
        maxTotalTimeout: timeout * 5,
        onprogress: (p) => {
          const now = Math.floor(this.now() / 1000);
          if (now !== second) [second, shown] = [now, 0];
          if (++shown > PROGRESS_PER_SECOND) return;
          const of = p.total !== undefined ? `/${p.total}` : "";
          ctx.onUpdate(this.opts.scrub(`[progress ${p.progress}${of}]${p.message ? ` ${p.message}` : ""}\n`));
        },
      })) as CallToolResult;
      const images = resultImages(result);
      return {
        output: clip(this.opts.scrub(resultText(result))),
        isError: result.isError === true,
        ...(images.length > 0 ? { images } : {}),
      };
    } catch (err) {
      const why = stop.signal.aborted && !ctx.signal.aborted ? (stop.signal.reason as Error) : (err as Error);
      if (ctx.signal.aborted) return { output: `${name}: aborted`, isError: true };
      return { output: `${name} failed: ${this.opts.scrub(why.message)}`, isError: true };
    } finally {
      this.inFlight.delete(stop);
      ctx.signal.removeEventListener("abort", onAbort);
      this.lastUsedMs = this.now();
    }
  }

  async close(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.state = "closed";
    this.retired = true;
    await client?.close().catch(() => undefined);
  }
}

/**
 * A tool's input schema as the loop and the model take it: an object schema without `$schema`
 * (MCP's default dialect is 2020-12; the loop's validator and the providers want plain schemas).
 */
function paramsOf(schema: McpTool["inputSchema"]): Record<string, unknown> {
  const { $schema: _, ...rest } = (schema ?? {}) as Record<string, unknown>;
  return { ...rest, type: "object" };
}

/**
 * A result's images for a vision model: PNG, JPEG, GIF or WebP by their bytes (a server's stated
 * type is not taken on trust), at most MAX_IMAGES and MAX_IMAGE_BYTES in all, as a message's.
 */
export function resultImages(result: CallToolResult): Image[] {
  const out: Image[] = [];
  let total = 0;
  for (const c of result.content ?? []) {
    if (c.type !== "image" || out.length >= MAX_IMAGES) continue;
    const data = Buffer.from(c.data, "base64");
    const type = sniffImage(data);
    if (!type || total + data.length > MAX_IMAGE_BYTES) continue;
    total += data.length;
    out.push(create(ImageSchema, { mimeType: type, data, sizeBytes: BigInt(data.length) }));
  }
  return out;
}

/** A result's content as the text the model reads: text as is, the rest said for what it is. */
export function resultText(result: CallToolResult): string {
  const parts: string[] = [];
  for (const c of result.content ?? []) {
    if (c.type === "text") parts.push(c.text);
    else if (c.type === "image" || c.type === "audio")
      parts.push(
        `[${c.type} ${c.mimeType}, ${Math.floor((c.data.length * 3) / 4)} bytes${c.type === "audio" ? ", not shown" : ""}]`,
      );
    else if (c.type === "resource_link") parts.push(`[resource ${c.uri}${c.name ? ` (${c.name})` : ""}]`);
    else if (c.type === "resource")
      parts.push(
        "text" in c.resource
          ? `[resource ${c.resource.uri}]\n${c.resource.text}`
          : `[resource ${c.resource.uri}, ${c.resource.mimeType ?? "binary"}, not shown]`,
      );
  }
  if (result.structuredContent !== undefined) {
    const json = JSON.stringify(result.structuredContent);
    if (!parts.some((p) => p.includes(json))) parts.push(json);
  }
  return parts.join("\n") || (result.isError ? "(the tool failed and said nothing)" : "(no output)");
}
