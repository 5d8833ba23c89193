// A scripted model server that speaks the OpenAI HTTP API (chat completions with SSE streaming and
// tool calls, embeddings, model list). It stands in for a real model where none can be reached and
// in tests; its replies follow fixed rules, documented in docs/scripted-model.md:
//
//   last message is a tool result  -> a text reply that quotes each result of the batch
//   "$ CMD"                        -> one `exec` tool call running CMD
//   "$$ A ;; B ;; C"               -> one batch of `exec` calls
//   "!tokens N [rate=R]"           -> N tokens ("t1 t2 ..."), at R tokens/s if given
//   "!bench N"                     -> N tokens, each "@<write time in ms> " (for latency figures)
//   "!think TEXT"                  -> TEXT as reasoning deltas, then a short answer
//   "!fail STATUS [times=N]"       -> HTTP STATUS with an OpenAI error body (only the first N times)
//   "!cut N [rate=R]"              -> N tokens, then the connection is cut mid-stream
//   "!call NAME ARGS [;; NAME ARGS]" -> calls of tool NAME with ARGS as their raw arguments text, one batch
//   "!first"                       -> the first message after the system prompt (to see a compaction summary)
//   "!system"                      -> the request's system prompt, word by word (to test context)
//   "!finish REASON"               -> a short reply that ends with finish_reason REASON
//   "!overflow N"                  -> 400 context_length_exceeded while the request has more than N messages
//   system prompt "[troupe:summarize]" -> a structured summary of the transcript (fails with 500 if
//                                     the transcript contains "!nosummary")
//   anything else                  -> "You said: TEXT", one token per word
//
// "!fail" also takes retry-after=S (sent as the Retry-After header) and model=M (fail only requests
// for model M, so a fallback model answers).
import http from "node:http";
import { once } from "node:events";
import { performance } from "node:perf_hooks";
import { HASH_EMBEDDING_DIM, hashEmbedding } from "../shared/hash-embedding.js";

export interface ScriptedModelOptions {
  host?: string;
  port?: number;
  /** Default tokens per second for streamed replies; 0 streams as fast as the client reads. */
  tokenRate?: number;
}

interface ToolCallOut {
  id: string;
  name: string;
  arguments: string;
}
interface Reply {
  text: string[]; // tokens, each written as one chunk
  thinking?: string[];
  toolCalls?: ToolCallOut[];
  rate: number;
  cutAfter?: number;
  stamp?: boolean;
  fail?: { status: number; message: string; retryAfter?: number; code?: string };
  finish?: string;
}

interface InMessage {
  role: string;
  content?: unknown;
  name?: string;
  tool_call_id?: string;
}

const nowMs = () => performance.timeOrigin + performance.now();
const words = (s: string) => s.split(/(?<=\s)/).filter((w) => w.length > 0);

/** Learning rule 1: "remember that X" in a user line is the fact X; "forget that X" is "[forget] X". */
function extractFacts(transcript: string): string[] {
  const facts: string[] = [];
  for (const line of transcript.split("\n")) {
    if (!line.startsWith("user:")) continue;
    for (const sentence of line.slice(5).split(/(?<=[.!?])\s+/)) {
      const m = /^\s*(remember|forget) that (.+?)[.!?]?\s*$/i.exec(sentence);
      if (!m) continue;
      const fact = m[2].charAt(0).toUpperCase() + m[2].slice(1);
      facts.push(m[1].toLowerCase() === "forget" ? `[forget] ${fact}` : fact);
    }
  }
  return facts;
}

const wordSet = (s: string) => new Set(s.toLowerCase().match(/[\p{L}\p{N}']+/gu) ?? []);

/**
 * Learning rule 2: a "[forget]" fact deletes the stored memory it shares most words with (half or
 * more); a fact already stored is NONE; one whose first three words match a stored memory's
 * updates it; anything else is ADD.
 */
function decideMemory(request: string): Record<string, unknown> {
  const raw = /New fact: (.*)/.exec(request)?.[1]?.trim() ?? "";
  const stored = [...request.matchAll(/^(\d+): (.*)$/gm)].map((m) => ({ n: Number(m[1]), text: m[2].trim() }));
  if (raw.startsWith("[forget] ")) {
    const fact = wordSet(raw.slice(9));
    let best: { n: number; overlap: number } | undefined;
    for (const s of stored) {
      const w = wordSet(s.text);
      const overlap = [...fact].filter((x) => w.has(x)).length / Math.max(1, new Set([...fact, ...w]).size);
      if (!best || overlap > best.overlap) best = { n: s.n, overlap };
    }
    return best && best.overlap >= 0.5 ? { event: "DELETE", n: best.n } : { event: "NONE" };
  }
  if (stored.some((s) => s.text.toLowerCase() === raw.toLowerCase())) return { event: "NONE" };
  const head = (s: string) => s.toLowerCase().split(/\s+/).slice(0, 3).join(" ");
  const same = stored.find((s) => head(s.text) === head(raw));
  return same ? { event: "UPDATE", n: same.n, text: raw } : { event: "ADD" };
}

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p?.text === "string" ? p.text : "")).join("");
  return "";
}

function option(text: string, name: string): number | undefined {
  const m = new RegExp(`\\b${name}=(\\d+(?:\\.\\d+)?)`).exec(text);
  return m ? Number(m[1]) : undefined;
}

export class ScriptedModel {
  private readonly failures = new Map<string, number>();
  private callCounter = 0;
  constructor(private readonly tokenRate: number) {}

  /** The reply the rules give for a conversation. */
  reply(messages: InMessage[], toolNames: Set<string>, model = ""): Reply {
    const rate = this.tokenRate;
    // The memory service's learning requests (services/memory/learn.ts), by the marker their system prompt starts with.
    const system = messages[0]?.role === "system" ? contentText(messages[0].content) : "";
    if (system.startsWith("[troupe:extract-facts]"))
      return { text: [JSON.stringify({ facts: extractFacts(contentText(messages.at(-1)?.content)) })], rate };
    if (system.startsWith("[troupe:decide-memory]"))
      return { text: [JSON.stringify(decideMemory(contentText(messages.at(-1)?.content)))], rate };
    if (system.startsWith("[troupe:summarize]")) {
      const transcript = contentText(messages.at(-1)?.content);
      if (transcript.includes("!nosummary"))
        return {
          text: [],
          rate,
          fail: { status: 500, message: "scripted failure: summaries are refused for this transcript" },
        };
      return { text: words(summarise(transcript)), rate };
    }
    const last = messages[messages.length - 1];
    if (!last) return { text: words("Nothing to answer."), rate };
    if (last.role === "tool") {
      const results: string[] = [];
      for (let i = messages.length - 1; i >= 0 && messages[i].role === "tool"; i--) {
        const body = contentText(messages[i].content).trim().replace(/\s+/g, " ").slice(0, 200);
        results.unshift(body === "" ? "(no output)" : body);
      }
      return { text: words(`Tool results: ${results.join(" | ")}`), rate };
    }
    const text = contentText(last.content).trim();

    if (text.startsWith("$$ ") || text.startsWith("$ ")) {
      const commands = text.startsWith("$$ ") ? text.slice(3).split(" ;; ") : [text.slice(2)];
      if (!toolNames.has("exec")) return { text: words("I have no exec tool here."), rate };
      return {
        text: [],
        rate,
        toolCalls: commands.map((command) => ({
          id: `call_${(++this.callCounter).toString(36)}`,
          name: "exec",
          arguments: JSON.stringify({ command: command.trim() }),
        })),
      };
    }
    const directive = /^!(\w+)\s*(.*)$/s.exec(text);
    if (directive) {
      const [, name, arg] = directive;
      const n = Number.parseInt(arg, 10);
      switch (name) {
        case "tokens":
          return {
            text: Array.from({ length: n > 0 ? n : 1 }, (_, i) => `t${i + 1} `),
            rate: option(arg, "rate") ?? rate,
          };
        case "bench":
          return {
            text: Array.from({ length: n > 0 ? n : 1 }, () => ""),
            rate: option(arg, "rate") ?? rate,
            stamp: true,
          };
        case "think":
          return { thinking: words(arg), text: words("Thought about it."), rate };
        case "call": {
          // Tool calls exactly as given, valid or not: for testing how bad calls are handled.
          const toolCalls: ToolCallOut[] = [];
          for (const part of arg.split(" ;; ")) {
            const m = /^(\S+)\s*(.*)$/s.exec(part.trim());
            if (m) toolCalls.push({ id: `call_${(++this.callCounter).toString(36)}`, name: m[1], arguments: m[2] });
          }
          if (toolCalls.length === 0) break;
          return { text: [], rate, toolCalls };
        }
        case "first": {
          const first = messages.find((m) => m.role !== "system");
          return { text: words(contentText(first?.content).slice(0, 400) || "(none)"), rate };
        }
        case "system": {
          const system = messages
            .filter((m) => m.role === "system")
            .map((m) => contentText(m.content))
            .join("\n");
          return { text: words(system || "(no system prompt)"), rate };
        }
        case "cut":
          return {
            text: Array.from({ length: 1000 }, (_, i) => `t${i + 1} `),
            rate: option(arg, "rate") ?? rate,
            cutAfter: n > 0 ? n : 1,
          };
        case "fail": {
          const status = n >= 400 && n <= 599 ? n : 500;
          const only = /\bmodel=(\S+)/.exec(arg)?.[1];
          if (only !== undefined && only !== model) return { text: words(`Answered by ${model}.`), rate };
          const times = option(arg, "times");
          const seen = (this.failures.get(text) ?? 0) + 1;
          this.failures.set(text, seen);
          if (times === undefined || seen <= times) {
            return {
              text: [],
              rate,
              fail: {
                status,
                message: `scripted failure ${status} (${seen}${times ? `/${times}` : ""})`,
                retryAfter: option(arg, "retry-after"),
              },
            };
          }
          return { text: words(`Recovered after ${times} failures.`), rate };
        }
        case "finish":
          return { text: words("Stopped early."), rate, finish: arg.trim() || "weird" };
        case "overflow": {
          const count = messages.filter((m) => m.role !== "system").length;
          if (count > (n > 0 ? n : 1)) {
            return {
              text: [],
              rate,
              fail: {
                status: 400,
                code: "context_length_exceeded",
                message: `This model's maximum context length is exceeded: the request has ${count} messages (scripted limit ${n}).`,
              },
            };
          }
          return { text: words(`Fits in ${count} messages.`), rate };
        }
      }
    }
    return { text: words(`You said: ${text}`), rate };
  }
}

/** The summarize rule: the five sections, filled from the transcript's first and last requests. */
function summarise(transcript: string): string {
  const earlier = /Earlier summary:\n([\s\S]*?)\n\nConversation to summarise:/.exec(transcript)?.[1];
  const lines = transcript.split("\n");
  const users = lines.filter((l) => l.startsWith("user: ")).map((l) => l.slice(6));
  const calls = lines.filter((l) => l.startsWith("assistant called ")).length;
  const goal = /## Goal\n(.*)/.exec(earlier ?? "")?.[1] ?? users[0] ?? "(none)";
  return [
    "## Goal",
    goal,
    "## Constraints",
    "(scripted summary)",
    "## Progress",
    `${users.length} requests and ${calls} tool calls folded; the last was: ${users.at(-1) ?? "(none)"}`,
    "## Decisions",
    "(none)",
    "## Next steps",
    "Continue with the recent messages.",
  ].join("\n");
}

/**
 * What the OpenAI API refuses with 400: a tool message that does not answer a call of the
 * assistant message before it, or an assistant's call left without its tool message.
 */
export function pairingProblem(messages: (InMessage & { tool_calls?: { id: string }[] })[]): string | undefined {
  let open: Set<string> | undefined;
  for (const m of messages) {
    if (m.role === "tool") {
      if (!open?.has(m.tool_call_id ?? ""))
        return `messages with role 'tool' must be a response to a preceding message with 'tool_calls' (${m.tool_call_id})`;
      open.delete(m.tool_call_id ?? "");
      continue;
    }
    if (open && open.size > 0)
      return `an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id' (missing: ${[...open].join(", ")})`;
    open = m.role === "assistant" ? new Set((m.tool_calls ?? []).map((c) => c.id)) : undefined;
  }
  if (open && open.size > 0)
    return `an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id' (missing: ${[...open].join(", ")})`;
  return undefined;
}

function countTokens(messages: InMessage[]): number {
  let n = 0;
  for (const m of messages) n += Math.ceil(contentText(m.content).length / 4) + 4;
  return n;
}

async function readJson(req: http.IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
}

function sendJson(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
  const data = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(data), ...headers });
  res.end(data);
}

/** Chunks written by this process, for tests that check backpressure reaches the model server. */
const stats = { chunksWritten: 0 };

async function streamReply(
  res: http.ServerResponse,
  reply: Reply,
  model: string,
  promptTokens: number,
  includeUsage: boolean,
) {
  const id = `chatcmpl-${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
  const created = Math.floor(Date.now() / 1000);
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  let aborted = false;
  res.on("close", () => (aborted = !res.writableFinished));
  const pause = reply.rate > 0 ? 1000 / reply.rate : 0;
  const wait = () => (pause > 0 ? new Promise((r) => setTimeout(r, pause)) : undefined);
  // Unpaced, a reply is one burst: chunks are gathered and written up to 16 KiB at a time, the
  // way a provider's network stack would batch them, instead of one write per token.
  const batching = pause === 0;
  let pending = "";
  const flush = async () => {
    if (pending === "") return;
    const data = pending;
    pending = "";
    if (!res.write(data)) await once(res, "drain");
  };
  // Every chunk is the same JSON around its delta: only the delta is encoded per token.
  const head = `data: {"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[{"index":0,"delta":`;
  const send = async (delta: Record<string, unknown>, finish: string | null = null) => {
    pending += `${head}${JSON.stringify(delta)},"finish_reason":${JSON.stringify(finish)}}]}\n\n`;
    stats.chunksWritten++;
    if (!batching || pending.length >= 16384) await flush();
  };

  await send({ role: "assistant", content: "" });
  let written = 0;
  for (const t of reply.thinking ?? []) {
    if (aborted) return;
    await send({ reasoning_content: t });
    await wait();
  }
  for (const t of reply.text) {
    if (aborted) return;
    if (reply.cutAfter !== undefined && written >= reply.cutAfter) {
      await flush();
      res.socket?.destroy();
      return;
    }
    await send({ content: reply.stamp ? `@${nowMs().toFixed(3)} ` : t });
    written++;
    await wait();
  }
  for (const [index, call] of (reply.toolCalls ?? []).entries()) {
    await send({
      tool_calls: [{ index, id: call.id, type: "function", function: { name: call.name, arguments: "" } }],
    });
    // Arguments arrive in two pieces, as real providers split them.
    const half = Math.ceil(call.arguments.length / 2);
    await send({ tool_calls: [{ index, function: { arguments: call.arguments.slice(0, half) } }] });
    await send({ tool_calls: [{ index, function: { arguments: call.arguments.slice(half) } }] });
  }
  await send({}, reply.finish ?? (reply.toolCalls?.length ? "tool_calls" : "stop"));
  if (includeUsage) {
    const completion = written + (reply.thinking?.length ?? 0) + (reply.toolCalls?.length ?? 0) * 10;
    const usage = {
      prompt_tokens: promptTokens,
      completion_tokens: completion,
      total_tokens: promptTokens + completion,
    };
    pending += `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model, choices: [], usage })}\n\n`;
  }
  await flush();
  res.end("data: [DONE]\n\n");
}

function completeReply(res: http.ServerResponse, reply: Reply, model: string, promptTokens: number) {
  const calls = reply.toolCalls ?? [];
  const completion = reply.text.length;
  sendJson(res, 200, {
    id: `chatcmpl-${Date.now().toString(36)}`,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [
      {
        index: 0,
        finish_reason: calls.length ? "tool_calls" : "stop",
        message: {
          role: "assistant",
          content: calls.length ? null : reply.text.join(""),
          ...(calls.length
            ? {
                tool_calls: calls.map((c) => ({
                  id: c.id,
                  type: "function",
                  function: { name: c.name, arguments: c.arguments },
                })),
              }
            : {}),
        },
      },
    ],
    usage: { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion },
  });
}

export interface RunningModelServer {
  port: number;
  close(): Promise<void>;
}

export async function startScriptedModelServer(options: ScriptedModelOptions = {}): Promise<RunningModelServer> {
  const model = new ScriptedModel(options.tokenRate ?? 0);
  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url ?? "/", "http://x");
      if (req.method === "GET" && url.pathname === "/healthz") return sendJson(res, 200, { ok: true });
      if (req.method === "GET" && url.pathname === "/stats")
        return sendJson(res, 200, { chunks_written: stats.chunksWritten });
      if (req.method === "GET" && url.pathname === "/v1/models") {
        return sendJson(res, 200, {
          object: "list",
          data: [{ id: "scripted-1", object: "model", created: 0, owned_by: "troupe" }],
        });
      }
      if (req.method === "POST" && url.pathname === "/v1/embeddings") {
        const body = await readJson(req);
        const inputs = Array.isArray(body.input) ? body.input.map(String) : [String(body.input ?? "")];
        const dim = typeof body.dimensions === "number" ? body.dimensions : HASH_EMBEDDING_DIM;
        return sendJson(res, 200, {
          object: "list",
          model: body.model ?? "scripted-embedding",
          data: inputs.map((text, index) => ({
            object: "embedding",
            index,
            embedding: Array.from(hashEmbedding(text, dim)),
          })),
          usage: { prompt_tokens: inputs.join(" ").length >> 2, total_tokens: inputs.join(" ").length >> 2 },
        });
      }
      if (req.method === "POST" && url.pathname === "/v1/chat/completions") {
        const body = await readJson(req);
        const messages = Array.isArray(body.messages) ? (body.messages as InMessage[]) : [];
        const tools = Array.isArray(body.tools) ? (body.tools as { function?: { name?: string } }[]) : [];
        const modelName = typeof body.model === "string" ? body.model : "scripted-1";
        const unpaired = pairingProblem(messages);
        if (unpaired)
          return sendJson(res, 400, {
            error: { message: `Invalid parameter: ${unpaired}`, type: "invalid_request_error", code: null },
          });
        const reply = model.reply(messages, new Set(tools.map((t) => t.function?.name ?? "")), modelName);
        if (reply.fail) {
          const type =
            reply.fail.status === 429
              ? "rate_limit_error"
              : reply.fail.status >= 500
                ? "server_error"
                : "invalid_request_error";
          const retryAfter = reply.fail.retryAfter ?? (reply.fail.status === 429 ? 1 : undefined);
          return sendJson(
            res,
            reply.fail.status,
            { error: { message: reply.fail.message, type, code: reply.fail.code ?? null } },
            retryAfter === undefined ? {} : { "retry-after": String(retryAfter) },
          );
        }
        const promptTokens = countTokens(messages);
        if (body.stream === true) {
          const includeUsage = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;
          return await streamReply(res, reply, modelName, promptTokens, includeUsage);
        }
        return completeReply(res, reply, modelName, promptTokens);
      }
      sendJson(res, 404, {
        error: { message: `no route ${req.method} ${url.pathname}`, type: "invalid_request_error" },
      });
    } catch (err) {
      if (!res.headersSent)
        sendJson(res, 400, { error: { message: (err as Error).message, type: "invalid_request_error" } });
      else res.destroy();
    }
  });
  server.keepAliveTimeout = 60_000;
  server.listen(options.port ?? 0, options.host ?? "127.0.0.1");
  await once(server, "listening");
  const port = (server.address() as { port: number }).port;
  return {
    port,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
