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
//   "!params"                      -> "temperature=T max_tokens=N" as the request set them ("-": unset)
//   "!finish REASON"               -> a short reply that ends with finish_reason REASON
//   "!overflow N"                  -> 400 context_length_exceeded while the request has more than N messages
//   system prompt "[troupe:summarize]" -> a structured summary of the transcript (fails with 500 if
//                                     the transcript contains "!nosummary")
//   anything else                  -> "You said: TEXT", one token per word
//
// "!fail" also takes retry-after=S (sent as the Retry-After header) and model=M (fail only requests
// for model M, so a fallback model answers).
import { performance } from "node:perf_hooks";

export interface ScriptedModelOptions {
  host?: string;
  port?: number;
  /** Default tokens per second for streamed replies; 0 streams as fast as the client reads. */
  tokenRate?: number;
}

export interface ToolCallOut {
  id: string;
  name: string;
  arguments: string;
}
export interface Reply {
  text: string[]; // tokens, each written as one chunk
  thinking?: string[];
  toolCalls?: ToolCallOut[];
  rate: number;
  cutAfter?: number;
  stamp?: boolean;
  fail?: { status: number; message: string; retryAfter?: number; code?: string };
  finish?: string;
}

export interface InMessage {
  role: string;
  content?: unknown;
  name?: string;
  tool_call_id?: string;
}

export const nowMs = () => performance.timeOrigin + performance.now();
export const words = (s: string) => s.split(/(?<=\s)/).filter((w) => w.length > 0);

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

// The name ends at the first ": " (display names have no ':'; ids such as "telegram:42" have no ": ").
const SPEAKER_LABEL = /^\[\d{4}-\d\d-\d\d \d\d:\d\d UTC\] [^\n]{1,160}?: /;

export function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p?.text === "string" ? p.text : "")).join("");
  return "";
}

export function option(text: string, name: string): number | undefined {
  const m = new RegExp(`\\b${name}=(\\d+(?:\\.\\d+)?)`).exec(text);
  return m ? Number(m[1]) : undefined;
}

export class ScriptedModel {
  private readonly failures = new Map<string, number>();
  private callCounter = 0;
  constructor(private readonly tokenRate: number) {}

  /** The reply the rules give for a conversation. */
  reply(
    messages: InMessage[],
    toolNames: Set<string>,
    model = "",
    sampling: { temperature?: unknown; maxTokens?: unknown } = {},
  ): Reply {
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
    // A channel message comes labelled "[time] name: text" (transcript.ts); the rules read the text.
    const heard = contentText(last.content).trim();
    const text = heard.replace(SPEAKER_LABEL, "");

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
        case "params":
          return {
            text: words(`temperature=${sampling.temperature ?? "-"} max_tokens=${sampling.maxTokens ?? "-"}`),
            rate,
          };
        case "heard":
          return { text: words(heard), rate };
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
