// Inbound safety checks (after PocketPaw): every user message passes an injection scanner and the
// threat checks plugins registered before it enters a run. A "high" verdict blocks the message:
// the session shows a message_blocked event saying why, the audit log keeps the block, and the
// message never reaches the model. "medium" lets it through and is audited as flagged.
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
  { level: "high", re: /\b(ignore|disregard|forget|override)\s+(all\s+|any\s+|the\s+|your\s+)*(previous|prior|above|earlier|preceding|system)\s+(instructions|prompts?|rules|directions|messages)/i, reason: "asks the agent to drop its instructions" },
  { level: "high", re: /\b(reveal|print|show|repeat|output|leak)\s+(me\s+)?(your|the)\s+(full\s+|hidden\s+|original\s+)?(system\s+prompt|instructions|hidden\s+prompt)/i, reason: "asks for the system prompt" },
  { level: "high", re: /<\|(im_start|im_end|system|endoftext)\|>|\[\/?INST\]|<<SYS>>/i, reason: "contains chat-template control tokens" },
  { level: "high", re: /\byou\s+are\s+now\s+(in\s+)?(DAN|developer\s+mode|jailbroken|unfiltered|unrestricted)/i, reason: "tries to switch the agent into an unrestricted mode" },
  { level: "medium", re: /^\s*(system|assistant)\s*:/im, reason: "impersonates a system or assistant turn" },
  { level: "medium", re: /\b(pretend|act)\s+(to\s+be|as\s+if|like)\s+.{0,40}\b(no|without)\s+(rules|restrictions|limits|filters)/i, reason: "asks the agent to act without its rules" },
];

const RANK: Record<ThreatLevel, number> = { none: 0, low: 1, medium: 2, high: 3 };

/** The built-in scanner: the most severe pattern the text matches. */
export function scanForInjection(text: string): SafetyVerdict {
  let worst: SafetyVerdict = { level: "none", check: "injection_scanner", reason: "" };
  // Zero-width characters are a common way to split trigger words past a scanner.
  const plain = text.replace(/[\u200B-\u200D\u2060\uFEFF]/g, "");
  for (const p of PATTERNS) {
    if (RANK[p.level] > RANK[worst.level] && p.re.test(plain)) worst = { level: p.level, check: "injection_scanner", reason: p.reason };
  }
  return worst;
}

export class InboundSafety {
  constructor(private readonly checks: readonly { name: string; timeoutMs: number; check: ThreatCheck }[]) {}

  /** The most severe verdict of the scanner and every registered check (stopping at the first "high"). */
  async check(text: string, info: TurnInfo & { frameId: string }): Promise<SafetyVerdict> {
    let worst = scanForInjection(text);
    for (const c of this.checks) {
      if (worst.level === "high") break;
      let verdict: SafetyVerdict;
      try {
        const v = await withTimeout((signal) => c.check(text, info, signal), c.timeoutMs, `threat check ${c.name}`);
        if (!v || !(v.level in RANK)) throw new Error(`returned ${JSON.stringify(v)}, not a verdict`);
        verdict = { level: v.level, check: c.name, reason: v.reason ?? "" };
      } catch (err) {
        verdict = { level: "high", check: c.name, reason: `the check failed, so the message is blocked: ${(err as Error).message ?? err}` };
      }
      if (RANK[verdict.level] > RANK[worst.level]) worst = verdict;
    }
    return worst;
  }
}
