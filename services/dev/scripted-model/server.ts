// The scripted model's HTTP side: the OpenAI API's endpoints (chat completions, streamed as SSE or
// not, embeddings, models), requests checked as the API checks them (tool message pairing), and the
// replies the rules (rules.ts) choose, written with backpressure. Plain HTTP/1.1 by default, as
// local model servers speak; with a certificate, HTTPS offering h2 then http/1.1 by ALPN, as hosted
// APIs are reached (bench/stream --model-tls measures that path).
import http from "node:http";
import http2 from "node:http2";
import { once } from "node:events";
import type { Socket } from "node:net";
import { HASH_EMBEDDING_DIM, hashEmbedding } from "../../shared/models/hash-embedding.js";
import { ScriptedModel, contentText, nowMs, type InMessage, type Reply, type ScriptedModelOptions } from "./rules.js";

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
  // No connection header: HTTP/1.1 keeps the connection alive by default, and HTTP/2 forbids it.
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  let aborted = false;
  res.on("close", () => (aborted = !res.writableEnded));
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
      cut(res);
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

/** Breaks a reply off mid-stream: its connection closed (HTTP/1.1), or its stream reset (HTTP/2). */
function cut(res: http.ServerResponse): void {
  const stream = (res as unknown as Partial<http2.Http2ServerResponse>).stream;
  if (stream) stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  else res.socket?.destroy();
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

export interface ScriptedServerOptions extends ScriptedModelOptions {
  /** Serve HTTPS with this certificate and key (PEM), h2 and http/1.1 offered. */
  tls?: { cert: Buffer; key: Buffer };
}

export async function startScriptedModelServer(options: ScriptedServerOptions = {}): Promise<RunningModelServer> {
  const model = new ScriptedModel(options.tokenRate ?? 0);
  // node:http2's compatibility request and response take every call made here, so one handler
  // serves both versions.
  const handle = async (req: http.IncomingMessage, res: http.ServerResponse) => {
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
        const reply = model.reply(messages, new Set(tools.map((t) => t.function?.name ?? "")), modelName, {
          temperature: body.temperature,
          maxTokens: body.max_completion_tokens ?? body.max_tokens,
        });
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
  };
  const server = options.tls
    ? http2.createSecureServer(
        { ...options.tls, allowHTTP1: true },
        handle as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
      )
    : Object.assign(http.createServer(handle), { keepAliveTimeout: 60_000 });
  const sockets = new Set<Socket>();
  server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  server.listen(options.port ?? 0, options.host ?? "127.0.0.1");
  await once(server, "listening");
  const port = (server.address() as { port: number }).port;
  return {
    port,
    close: () =>
      new Promise((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
