// Token counts for the context budget. OpenAI model families are counted with their own BPE
// tokenizer (o200k_base for gpt-4o, gpt-4.1, gpt-5 and the o-series; cl100k_base for gpt-4 and
// gpt-3.5). Any other family (Llama, Qwen, Mistral behind an OpenAI-compatible endpoint) is
// estimated as 1.25 times the larger of the two counts: those tokenizers are BPEs of similar
// vocabulary size, and a budget that over-counts compacts a little early where one that
// under-counts gets the request refused. test/tokens.test.ts holds the estimate to that.
//
// Counting is the costly part of budgeting a context (about 5 MB/s), so a message is counted once:
// counts are cached per message object, and the conversation only ever grows by new objects.
//
// The tables cost memory (cl100k about 38 MB resident, o200k about 66 MB; bench/history.md
// bench/footprint), and most contexts are far from their budget. So a counter starts with a
// bound instead: a text's UTF-8 length, which no BPE count exceeds (every token is at least one
// byte). Callers that find the bound over a budget call exact(), which loads the table once per
// process and counts exactly from then on; under a budget, the bound already proves the fit.
import type { ChatMessage } from "../../shared/gen/troupe/v1/session_pb.js";

type Encoding = { countTokens(text: string): number };

/** Chat formats add a few tokens per message (role markers, separators). */
export const MESSAGE_OVERHEAD_TOKENS = 4;
/** An unknown family's estimate, relative to the cl100k count. */
export const UNKNOWN_FAMILY_MARGIN = 1.25;

const encodings = new Map<string, Promise<Encoding>>();
// The tables are large (a few MB each): loaded on first use, once per process.
const load = (name: "o200k_base" | "cl100k_base"): Promise<Encoding> => {
  let e = encodings.get(name);
  if (!e) {
    e = import(`gpt-tokenizer/encoding/${name}`) as Promise<Encoding>;
    encodings.set(name, e);
  }
  return e;
};

export type TokenFamily = "o200k" | "cl100k" | "estimate";

export function familyOf(model: string): TokenFamily {
  const m = model.toLowerCase().replace(/^.*\//, "");
  if (/^(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o\d|chatgpt-4o|gpt-oss)/.test(m)) return "o200k";
  if (/^(gpt-4|gpt-3\.5|text-embedding-3|text-embedding-ada)/.test(m)) return "cl100k";
  return "estimate";
}

/**
 * Counts tokens the way the model's family does (see the module comment for other families):
 * an upper bound until exact() is called, exactly after.
 */
export class TokenCounter {
  private cache = new WeakMap<object, number>();
  /** Long texts that recur unchanged (tool schemas, workspace files), by content. */
  private readonly recurring = new Map<string, number>();
  private count: (text: string) => number;
  private loading?: Promise<void>;
  /** Whether counts are exact; until then every count is at least the exact one. */
  isExact = false;

  private constructor(readonly family: TokenFamily) {
    const margin = family === "estimate" ? UNKNOWN_FAMILY_MARGIN : 1;
    this.count = (t) => Math.ceil(margin * Buffer.byteLength(t, "utf8"));
  }

  /** A counter for `model`'s family, counting by the bound until exact() is called. */
  static forModel(model: string): TokenCounter {
    return new TokenCounter(familyOf(model));
  }

  /** A counter that counts exactly from the start. */
  static async exactForModel(model: string): Promise<TokenCounter> {
    const counter = TokenCounter.forModel(model);
    await counter.exact();
    return counter;
  }

  /** Loads the family's table (once) and counts exactly from then on. Earlier counts are forgotten. */
  exact(): Promise<void> {
    this.loading ??= (async () => {
      let count: (text: string) => number;
      if (this.family === "o200k" || this.family === "cl100k") {
        const enc = await load(this.family === "o200k" ? "o200k_base" : "cl100k_base");
        count = (t) => enc.countTokens(t);
      } else {
        const cl = await load("cl100k_base");
        count = (t) => Math.ceil(UNKNOWN_FAMILY_MARGIN * cl.countTokens(t));
      }
      this.count = count;
      this.cache = new WeakMap();
      this.recurring.clear();
      this.isExact = true;
    })();
    return this.loading;
  }

  text(text: string): number {
    return text === "" ? 0 : this.count(text);
  }

  /** Like text(), remembering the count: for texts that come back unchanged run after run. */
  recurringText(text: string): number {
    let n = this.recurring.get(text);
    if (n === undefined) {
      n = this.text(text);
      if (this.recurring.size >= 256) this.recurring.clear();
      this.recurring.set(text, n);
    }
    return n;
  }

  /** The tools' schemas as a request carries them (remembered, as recurringText). */
  tools(tools: readonly object[]): number {
    return tools.length === 0 ? 0 : this.recurringText(JSON.stringify(tools));
  }

  /** One conversation message as the model receives it (text, tool calls, overhead). */
  message(m: ChatMessage): number {
    let n = this.cache.get(m);
    if (n === undefined) {
      // A speaker's label ("[2026-11-24 17:05 UTC] name: ") goes before the text (transcript.ts spoken).
      n = MESSAGE_OVERHEAD_TOKENS + this.text(m.text) + (m.speaker ? 14 + this.text(m.speaker.displayName) : 0);
      for (const c of m.toolCalls) n += MESSAGE_OVERHEAD_TOKENS + this.text(c.name) + this.text(c.argumentsJson);
      this.cache.set(m, n);
    }
    return n;
  }
}
