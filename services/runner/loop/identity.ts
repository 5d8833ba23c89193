// The <identity> block: who the agent is, closest to the conversation. It holds, in this order,
// the name and persona of agent.json, IDENTITY.md, SOUL.md and, for the owner, the owner's
// USER.md. Nothing in it contradicts IDENTITY.md: the name heading is left out when the operator
// wrote IDENTITY.md and gave agent.json no name of its own, and the fallback sentence ("You are
// <name>, an agent served by Troupe") is used only when there is nothing else.
//
// A speaker who is not an owner gets the same agent (its persona is the agent's, not the owner's)
// but never the owner's profile, and a line saying who they are.
import type { PromptInput } from "./prompt-input.js";

export interface IdentityPart {
  /** IDENTITY.md, SOUL.md or USER.md. */
  label: string;
  text: string;
}

const HEADINGS: Record<string, string> = {
  "IDENTITY.md": "### IDENTITY.md",
  "SOUL.md": "### SOUL.md",
  "USER.md": "### Your owner, who you are talking with (USER.md)",
};

/** Cut first under budget pressure: the profile, then the soul, then the identity. */
const CUT_ORDER = ["USER.md", "SOUL.md", "IDENTITY.md"];
/** What the reminder restates of the identity, at most. */
const REMINDER_CHARS = 400;

export class IdentityBlock {
  constructor(
    private readonly input: Pick<PromptInput, "agent" | "agentId" | "sender" | "driftReminder">,
    private readonly parts: IdentityPart[],
  ) {}

  /** The block, and after it the reminder once the conversation is long (DRIFT_THRESHOLD). */
  render(): string {
    const block = ["<identity>", ...this.body(), "</identity>"].join("\n");
    return this.input.driftReminder ? `${block}\n\n${this.reminder()}` : block;
  }

  private body(): string[] {
    const { agent, agentId, sender } = this.input;
    const has = (label: string) => this.parts.some((p) => p.label === label && p.text !== "");
    const named = agent.name !== agentId || !has("IDENTITY.md");
    const lines: string[] = [];
    if (named) lines.push(`# Identity: ${agent.name}`);
    if (agent.persona.trim() !== "") lines.push(agent.persona.trim());
    for (const p of this.parts) if (p.text !== "") lines.push(`${HEADINGS[p.label]}\n${p.text}`);
    if (lines.length === (named ? 1 : 0)) lines.push(`You are ${agent.name}, an agent served by Troupe.`);
    if (!sender.isOwner)
      lines.push(
        `You are talking with ${sender.displayName || sender.id}, who is not your owner. Be helpful and courteous. Do not share anything about your owner or other people you know of.`,
      );
    return lines;
  }

  /** Restates who the agent is: its name, and the start of its persona or IDENTITY.md. */
  private reminder(): string {
    const { agent } = this.input;
    const core = agent.persona.trim() || this.parts.find((p) => p.label === "IDENTITY.md")?.text || "";
    const first = core.split(/\n\s*\n/)[0].slice(0, REMINDER_CHARS);
    const who = agent.name !== this.input.agentId || core === "" ? `You are ${agent.name}. ` : "";
    return `# Identity reminder\n${who}${first}${first ? "\n" : ""}However long this conversation grows, keep to the <identity> block above: its personality, tone and communication style.`;
  }

  /**
   * Cuts the parts, profile first, until the rendered block fits `tokens` (as `count` counts).
   * Returns what was cut, e.g. ["USER.md to 120 characters"]; the name and persona are never cut.
   */
  cutTo(tokens: number, count: (text: string) => number): string[] {
    const cut: string[] = [];
    for (const label of CUT_ORDER) {
      const part = this.parts.find((p) => p.label === label);
      if (!part || part.text === "") continue;
      let over = count(this.render()) - tokens;
      if (over <= 0) break;
      // About four characters a token; halve again until it fits or nothing is left of it.
      let keep = Math.max(0, part.text.length - over * 4);
      for (;;) {
        part.text = part.text.slice(0, keep);
        over = count(this.render()) - tokens;
        if (over <= 0 || keep === 0) break;
        keep = Math.floor(keep / 2);
      }
      cut.push(`${label} to ${part.text.length} characters`);
      if (over <= 0) break;
    }
    return cut;
  }
}
