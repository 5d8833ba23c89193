// The conversation as the model gets it. The log keeps every message the session ever had; the
// actor holds those from the latest compaction's cut on (held-history.ts); what goes to the model
// is a view of them:
//
//   [compaction summary] + messages after the last compaction's cut
//     -> sanitised (every tool call answered right after it, nothing orphaned or repeated)
//     -> fitted to the token budget, newest first, whole blocks only
//
// A "block" is what must stay together: a user message, or an assistant message with the results
// of all its tool calls. Cutting between a call and its result is the one thing providers refuse.
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ChatMessageSchema, Role, type ChatMessage } from "../../shared/gen/troupe/v1/session_pb.js";
import type { ModelMessage } from "../providers/model.js";
import type { TokenCounter } from "../loop/tokens.js";

/** Put in place of a result that was never recorded (a crash between the call and its end). */
export const MISSING_RESULT = "No result was recorded for this tool call (the run was interrupted before it finished).";

/** What sanitising changed, for the run's debug log and for tests. */
export interface SanitiseReport {
  duplicates: number;
  orphanResults: number;
  repairedCalls: number;
  droppedUserTurns: number;
}

/**
 * Orders and repairs a message list for a chat-completions request: messages deduplicated by id;
 * each tool result right after the assistant message that called it (the first result of that
 * call id recorded after the call wins);
 * results with no call before them removed; calls without a result given a stated error result;
 * empty user turns, and a trailing user turn that repeats the one before it, dropped.
 */
export function sanitise(history: readonly ChatMessage[]): { messages: ChatMessage[]; report: SanitiseReport } {
  const report: SanitiseReport = { duplicates: 0, orphanResults: 0, repairedCalls: 0, droppedUserTurns: 0 };
  const seen = new Set<string>();
  const unique: ChatMessage[] = [];
  for (const m of history) {
    if (m.id !== "" && seen.has(m.id)) {
      report.duplicates++;
      continue;
    }
    if (m.id !== "") seen.add(m.id);
    unique.push(m);
  }
  // Each call id's results in the order recorded. Ids repeat across turns: OpenAI-compatible
  // servers (and a restarted one) may number calls call_1, call_2... afresh in every reply, so a
  // call takes the first result of its id recorded after it; only when there is none, one recorded
  // before it that no call took.
  const results = new Map<string, { at: number; m: ChatMessage }[]>();
  unique.forEach((m, at) => {
    if (m.role !== Role.TOOL) return;
    const list = results.get(m.toolCallId) ?? [];
    list.push({ at, m });
    results.set(m.toolCallId, list);
  });
  const placed = new Set<ChatMessage>();
  const out: ChatMessage[] = [];
  for (const [at, m] of unique.entries()) {
    if (m.role === Role.TOOL) continue; // placed after its call, or an orphan
    if (m.role === Role.USER && m.text.trim() === "") {
      report.droppedUserTurns++;
      continue;
    }
    if (m.role === Role.ASSISTANT && m.text === "" && m.toolCalls.length === 0) continue; // a failed, empty reply
    out.push(m);
    for (const call of m.role === Role.ASSISTANT ? m.toolCalls : []) {
      const list = results.get(call.id) ?? [];
      const result = (list.find((r) => r.at > at && !placed.has(r.m)) ?? list.find((r) => !placed.has(r.m)))?.m;
      if (result) {
        placed.add(result);
        out.push(result);
      } else {
        report.repairedCalls++;
        out.push(
          create(ChatMessageSchema, {
            id: `${m.id}:${call.id}:missing`,
            role: Role.TOOL,
            toolCallId: call.id,
            toolName: call.name,
            text: MISSING_RESULT,
            isError: true,
          }),
        );
      }
    }
  }
  report.orphanResults = unique.filter((m) => m.role === Role.TOOL).length - placed.size;
  const last = out.at(-1);
  const prev = out.at(-2);
  if (last?.role === Role.USER && prev?.role === Role.USER && last.text.trim() === prev.text.trim()) {
    out.pop();
    report.droppedUserTurns++;
  }
  return { messages: out, report };
}

/** Start indexes of the blocks of a sanitised list (a block never splits a call from its result). */
export function blockStarts(messages: readonly ChatMessage[]): number[] {
  const starts: number[] = [];
  for (let i = 0; i < messages.length; i++) if (messages[i].role !== Role.TOOL) starts.push(i);
  return starts;
}

/**
 * The newest blocks that fit in `budget` tokens; older ones are dropped first. Returns the index
 * the kept part starts at (messages.length when nothing fits).
 */
export function fitNewestFirst(messages: readonly ChatMessage[], budget: number, tokens: TokenCounter): number {
  const starts = blockStarts(messages);
  let used = 0;
  let keepFrom = messages.length;
  for (let b = starts.length - 1; b >= 0; b--) {
    const end = b + 1 < starts.length ? starts[b + 1] : messages.length;
    let cost = 0;
    for (let i = starts[b]; i < end; i++) cost += tokens.message(messages[i]);
    if (used + cost > budget) break;
    used += cost;
    keepFrom = starts[b];
  }
  return keepFrom;
}

/**
 * Where a compaction cuts: the start of the oldest block such that the blocks from there on hold
 * at least `keepRecent` tokens, never the first block (something must be summarised). Undefined
 * when there is nothing before the kept part.
 */
export function compactionCut(
  messages: readonly ChatMessage[],
  keepRecent: number,
  tokens: TokenCounter,
): number | undefined {
  const starts = blockStarts(messages);
  if (starts.length < 2) return undefined;
  let kept = 0;
  for (let b = starts.length - 1; b >= 1; b--) {
    const end = b + 1 < starts.length ? starts[b + 1] : messages.length;
    for (let i = starts[b]; i < end; i++) kept += tokens.message(messages[i]);
    if (kept >= keepRecent) return starts[b];
  }
  return starts[1];
}

/** The summary of the older conversation, as the model sees it: the first message of the history. */
export function summaryMessage(summary: string): ModelMessage {
  return {
    role: "user",
    content: `The earlier part of this conversation was summarised to save room:\n<summary>\n${summary}\n</summary>`,
  };
}

export function toModelMessages(
  system: string,
  summary: string | undefined,
  history: readonly ChatMessage[],
): ModelMessage[] {
  const out: ModelMessage[] = [{ role: "system", content: system }];
  if (summary) out.push(summaryMessage(summary));
  const pendingImages: { tool: string; images: ChatMessage["images"] }[] = [];
  for (const [i, m] of history.entries()) {
    if (m.role === Role.USER)
      out.push({
        role: "user",
        content: m.speaker ? spoken(m) : m.text,
        ...(m.images.length > 0 ? { images: m.images.map((i) => ({ mimeType: i.mimeType, data: i.data })) } : {}),
      });
    else if (m.role === Role.ASSISTANT)
      out.push({
        role: "assistant",
        content: m.text,
        toolCalls: m.toolCalls.map((c) => ({ id: c.id, name: c.name, argumentsJson: c.argumentsJson })),
        ...(m.reasoning ? { model: m.model, reasoning: m.reasoning } : {}),
      });
    else if (m.role === Role.TOOL) {
      out.push({ role: "tool", toolCallId: m.toolCallId, content: m.text });
      if (m.images.length > 0) pendingImages.push({ tool: m.toolName, images: m.images });
    }
    // Images tools returned go after the last result of their batch (a result's own place takes
    // text only in most providers' APIs), as a user message that says where they came from.
    if (pendingImages.length > 0 && history[i + 1]?.role !== Role.TOOL) {
      out.push({
        role: "user",
        content: `[The images ${[...new Set(pendingImages.map((p) => p.tool))].join(", ")} returned, in order]`,
        images: pendingImages.flatMap((p) => p.images.map((img) => ({ mimeType: img.mimeType, data: img.data }))),
      });
      pendingImages.length = 0;
    }
  }
  return out;
}

/**
 * A channel message as the model sees it: "[2026-11-24 17:05 UTC] Alice: text", so that in a
 * group (or a main session many people write to) it knows who said what (MushroomAgent's format).
 */
export function spoken(m: ChatMessage): string {
  const at = m.time ? timestampDate(m.time).toISOString().slice(0, 16).replace("T", " ") : "";
  const who = m.speaker?.displayName || m.speaker?.id || "someone";
  return `${at ? `[${at} UTC] ` : ""}${who}: ${m.text}`;
}
