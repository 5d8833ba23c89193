// The conversation as the model sees it, and compaction: the view after the latest summary, its
// size in tokens, and a compaction that summarises what comes before a cut (by the model, else
// from what is known) when a request would not fit the window.
// tools, prompt, hooks); the loop itself holds no state between runs.
import { Role, type ChatMessage } from "../../shared/gen/troupe/v1/session_pb.js";
import { ModelError } from "../providers/model.js";
import { compactionCut, sanitise, summaryMessage } from "../session/transcript.js";
import { excerpt, type RunHost, type Turn, SUMMARY_MARKER } from "./run.js";
/** A summary has this much room to be written in. */
const SUMMARY_MAX_TOKENS = 2048;
const SUMMARY_TIMEOUT_MS = 120_000;

/**
 * The messages after the latest compaction's cut, sanitised; after a reset only the messages
 * since it, and no summary of what came before.
 */
export function conversationView(host: RunHost): { summary?: string; messages: ChatMessage[] } {
  const c = host.compaction();
  let from = 0;
  if (c) {
    const i = host.messages.findIndex((m) => m.id === c.firstKeptMessageId);
    if (i >= 0) from = i;
  }
  const summary = from >= host.contextFrom ? c?.summary : undefined;
  from = Math.max(from, host.contextFrom);
  return { summary, messages: sanitise(from === 0 ? host.messages : host.messages.slice(from)).messages };
}

export function viewTokens(turn: Turn, view: { summary?: string; messages: ChatMessage[] }): number {
  // The summary comes back unchanged in every request until the next compaction.
  let n =
    turn.fixedTokens +
    (view.summary ? turn.tokens.recurringText(summaryMessage(view.summary).content as string) + 4 : 0);
  for (const m of view.messages) n += turn.tokens.message(m);
  return n;
}

/**
 * Switches the run's counter to exact counts (tokens.ts) and counts its system prompt and tools
 * again: they may have been counted by the bound, even when the counter is exact now (another
 * session's run may have switched it since). For a run whose view may not fit by the bound.
 */
export async function countExactly(turn: Turn): Promise<void> {
  await turn.tokens.exact();
  const system = turn.tokens.recurringText(turn.system.text);
  const tools = turn.tokens.tools(turn.tools);
  turn.system = { ...turn.system, tokens: system };
  turn.fixedTokens = system + tools;
}

/**
 * Summarises the older part of the conversation view and keeps the recent part verbatim (at
 * least keepRecentTokens, cut only between blocks). False when there is nothing older to fold.
 */
export async function compact(turn: Turn, reason: "threshold" | "overflow", tokensBefore: number): Promise<boolean> {
  const { host } = turn;
  // Where to cut is decided by exact counts: the bound would keep too little verbatim.
  await countExactly(turn);
  const view = conversationView(host);
  const cut = compactionCut(view.messages, turn.agent.keepRecentTokens, turn.tokens);
  if (cut === undefined) return false;
  host.emit({ case: "compactionStart", value: { reason, tokensBefore } });
  const older = view.messages.slice(0, cut);
  let summary: string;
  let error = "";
  try {
    summary = await summarise(turn, view.summary, older);
  } catch (err) {
    error = err instanceof ModelError && err.aborted ? "the run was aborted" : String((err as Error)?.message ?? err);
    summary = metadataSummary(view.summary, older);
  }
  const after = viewTokens(turn, { summary, messages: view.messages.slice(cut) });
  host.emit({
    case: "compactionEnd",
    value: {
      summary,
      firstKeptMessageId: view.messages[cut].id,
      messagesSummarized: older.length,
      tokensBefore,
      tokensAfter: after,
      fallback: error !== "",
      error,
    },
  });
  return true;
}

function transcriptOf(messages: readonly ChatMessage[]): string {
  const clip = (s: string) => excerpt(s, 2000);
  const lines: string[] = [];
  for (const m of messages) {
    if (m.role === Role.USER) lines.push(`user: ${clip(m.text)}`);
    else if (m.role === Role.ASSISTANT) {
      if (m.text) lines.push(`assistant: ${clip(m.text)}`);
      for (const c of m.toolCalls) lines.push(`assistant called ${c.name}(${clip(c.argumentsJson)})`);
    } else if (m.role === Role.TOOL) lines.push(`${m.toolName} result${m.isError ? " (error)" : ""}: ${clip(m.text)}`);
  }
  return lines.join("\n");
}

/** The model writes the structured summary; throws when it cannot. */
async function summarise(turn: Turn, previous: string | undefined, older: readonly ChatMessage[]): Promise<string> {
  const system = [
    SUMMARY_MARKER,
    "You compact a conversation so that it can go on in a limited context window. Summarise the conversation below,",
    "merging the earlier summary if one is given. Use exactly these sections, in this order:",
    "## Goal\n## Constraints\n## Progress\n## Decisions\n## Next steps",
    "Keep names, paths, numbers, commands and open questions exactly. Write nothing but the summary.",
  ].join("\n");
  const user = `${previous ? `Earlier summary:\n${previous}\n\n` : ""}Conversation to summarise:\n${transcriptOf(older)}`;
  const signal = AbortSignal.any([turn.host.signal, AbortSignal.timeout(SUMMARY_TIMEOUT_MS)]);
  let text = "";
  for await (const chunk of turn.deps.model.stream(
    {
      model: turn.models[0],
      messages: [
        { role: "system", content: system },
        { role: "user", content: user },
      ],
      tools: [],
      maxTokens: SUMMARY_MAX_TOKENS,
    },
    signal,
  )) {
    if (chunk.type === "text") text += chunk.delta;
  }
  if (text.trim() === "") throw new Error("the model returned an empty summary");
  return text.trim();
}

/** When the model cannot summarise: what is known without it, so the turn can go on. */
export function metadataSummary(previous: string | undefined, older: readonly ChatMessage[]): string {
  const count = (r: Role) => older.filter((m) => m.role === r).length;
  const toolUses = new Map<string, number>();
  for (const m of older) for (const c of m.toolCalls) toolUses.set(c.name, (toolUses.get(c.name) ?? 0) + 1);
  const firstUser = older.find((m) => m.role === Role.USER)?.text ?? "";
  const lastUser = [...older].reverse().find((m) => m.role === Role.USER)?.text ?? "";
  return [
    "## Goal",
    excerpt(firstUser, 300) || "(unknown)",
    "## Constraints",
    "(not recorded: this summary was made without the model)",
    "## Progress",
    `${older.length} earlier messages were folded (${count(Role.USER)} from the user, ${count(Role.ASSISTANT)} from the assistant, ${count(Role.TOOL)} tool results).`,
    toolUses.size > 0
      ? `Tools used: ${[...toolUses].map(([n, k]) => `${n} ×${k}`).join(", ")}.`
      : "No tools were used.",
    lastUser && lastUser !== firstUser ? `The last folded request was: ${excerpt(lastUser, 300)}` : "",
    previous ? `An earlier summary said:\n${previous}` : "",
    "## Decisions",
    "(not recorded)",
    "## Next steps",
    "Continue from the recent messages that follow.",
  ]
    .filter((s) => s !== "")
    .join("\n");
}
