// Safety checks (after PocketPaw) wherever untrusted text enters the prompt: an injection scanner
// and the threat checks plugins registered. A user message (with its instruction) that scans
// "high" is blocked: the session shows a message_blocked event saying why, the audit log keeps
// the block, and the message never reaches the model; "medium" lets it through, audited as
// flagged. Tool results (command output, file content) are not the caller's to block: one that
// scans medium or high reaches the model behind a warning that it is data, not instructions.
// Recalled memories that scan medium or high are left out of the prompt. docs/turn-pipeline.md
// says what the scanner can and cannot catch.
//
// A threat check that throws or passes its deadline blocks the message (fail closed): an operator
// who installs a check wants nothing to pass unchecked, and a visible block gets the check fixed.
import { withTimeout, type ThreatCheck, type ThreatLevel, type TurnInfo } from "./hooks.js";

export interface SafetyVerdict {
  level: ThreatLevel;
  check: string;
  reason: string;
}

const PATTERNS: { level: ThreatLevel; re: RegExp; reason: string }[] = [
  {
    level: "high",
    re: /\b(ignore|disregard|forget|override)\s+(all\s+|any\s+|the\s+|your\s+)*(previous|prior|above|earlier|preceding|system)\s+(instructions|prompts?|rules|directions|messages)/i,
    reason: "asks the agent to drop its instructions",
  },
  {
    level: "high",
    re: /\b(reveal|print|show|repeat|output|leak)\s+(me\s+)?(your|the)\s+(full\s+|hidden\s+|original\s+)?(system\s+prompt|instructions|hidden\s+prompt)/i,
    reason: "asks for the system prompt",
  },
  {
    level: "high",
    re: /<\|(im_start|im_end|system|endoftext)\|>|\[\/?INST\]|<<SYS>>/i,
    reason: "contains chat-template control tokens",
  },
  {
    level: "high",
    re: /\byou\s+are\s+now\s+(in\s+)?(DAN|developer\s+mode|jailbroken|unfiltered|unrestricted)/i,
    reason: "tries to switch the agent into an unrestricted mode",
  },
  { level: "medium", re: /^\s*(system|assistant)\s*:/im, reason: "impersonates a system or assistant turn" },
  {
    level: "medium",
    re: /\b(pretend|act)\s+(to\s+be|as\s+if|like)\s+.{0,40}\b(no|without)\s+(rules|restrictions|limits|filters)/i,
    reason: "asks the agent to act without its rules",
  },
];

const RANK: Record<ThreatLevel, number> = { none: 0, low: 1, medium: 2, high: 3 };

/**
 * Letters of other scripts that look like Latin ones, folded to them before scanning ("іgnore"
 * with a Cyrillic і reads as "ignore" to a model, so it must to the scanner).
 */
const HOMOGLYPHS: Record<string, string> = {
  "\u0430": "a",
  "\u0435": "e",
  "\u043e": "o",
  "\u0440": "p",
  "\u0441": "c",
  "\u0443": "y",
  "\u0445": "x",
  "\u0456": "i",
  "\u0458": "j",
  "\u0455": "s",
  "\u0501": "d",
  "\u0261": "g",
  "\u04bb": "h",
  "\u0410": "A",
  "\u0412": "B",
  "\u0415": "E",
  "\u041a": "K",
  "\u041c": "M",
  "\u041d": "H",
  "\u041e": "O",
  "\u0420": "P",
  "\u0421": "C",
  "\u0422": "T",
  "\u0425": "X",
  "\u0406": "I",
  "\u03bf": "o",
  "\u03b1": "a",
  "\u03b5": "e",
  "\u03b9": "i",
  "\u03ba": "k",
  "\u03bd": "v",
  "\u03c1": "p",
  "\u03c4": "t",
  "\u03c5": "u",
  "\u03c7": "x",
  "\u0391": "A",
  "\u0392": "B",
  "\u0395": "E",
  "\u0397": "H",
  "\u0399": "I",
  "\u039a": "K",
  "\u039c": "M",
  "\u039d": "N",
  "\u039f": "O",
  "\u03a1": "P",
  "\u03a4": "T",
  "\u03a7": "X",
  "\u03a5": "Y",
  "\u0131": "i",
};
const HOMOGLYPH = new RegExp(`[${Object.keys(HOMOGLYPHS).join("")}]`, "g");

/** Invisible formatting characters (soft hyphen, zero-width, direction marks, variation selectors...). */
// biome-ignore lint/complexity/useRegexLiterals: as a literal, a class of combining marks reads to the linter as a misspelt alternation
const INVISIBLE = new RegExp(
  "[\\u00AD\\u034F\\u061C\\u115F\\u1160\\u17B4\\u17B5\\u180B-\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u206F\\uFE00-\\uFE0F\\uFEFF]",
  "g",
);

/**
 * Text as the scanner reads it: NFKC (full-width and styled letters become plain ones), zero-width
 * characters, soft hyphens and other invisible formatting removed (they split trigger words past
 * a pattern), look-alike letters of other scripts folded to Latin.
 */
export function normaliseForScan(text: string): string {
  return text
    .normalize("NFKC")
    .replace(INVISIBLE, "")
    .replace(HOMOGLYPH, (c) => HOMOGLYPHS[c]);
}

/** The built-in scanner: the most severe pattern the text matches. */
export function scanForInjection(text: string): SafetyVerdict {
  let worst: SafetyVerdict = { level: "none", check: "injection_scanner", reason: "" };
  const plain = normaliseForScan(text);
  for (const p of PATTERNS) {
    if (RANK[p.level] > RANK[worst.level] && p.re.test(plain))
      worst = { level: p.level, check: "injection_scanner", reason: p.reason };
  }
  return worst;
}

export class InboundSafety {
  constructor(private readonly checks: readonly { name: string; timeoutMs: number; check: ThreatCheck }[]) {}

  /**
   * The most severe verdict of the scanner and every registered check (stopping at the first
   * "high"). Plugins get the text normalised as the scanner reads it.
   */
  async check(raw: string, info: TurnInfo & { frameId: string }): Promise<SafetyVerdict> {
    const text = normaliseForScan(raw);
    let worst = scanForInjection(text);
    for (const c of this.checks) {
      if (worst.level === "high") break;
      let verdict: SafetyVerdict;
      try {
        const v = await withTimeout((signal) => c.check(text, info, signal), c.timeoutMs, `threat check ${c.name}`);
        if (!v || !(v.level in RANK)) throw new Error(`returned ${JSON.stringify(v)}, not a verdict`);
        verdict = { level: v.level, check: c.name, reason: v.reason ?? "" };
      } catch (err) {
        verdict = {
          level: "high",
          check: c.name,
          reason: `the check failed, so the message is blocked: ${(err as Error).message ?? err}`,
        };
      }
      if (RANK[verdict.level] > RANK[worst.level]) worst = verdict;
    }
    return worst;
  }
}
