// What a session's people chose for it, kept in its log as "settings" records: the model, the
// reasoning effort (each empty for the agent's), and where the model's view of the conversation
// starts (moved to the end by a reset). The default queue mode is the mailbox's, set alongside.
import type { ReplayedLog } from "./recovery.js";

/** A change as the open that asked for it says it ("default" effort: back to the agent's). */
export interface Choice {
  model?: string;
  reasoningEffort?: string;
  reset?: boolean;
}

export type ChoiceRecord = { model?: string; reasoningEffort?: string; contextFrom?: number };

export class SessionChoices {
  /** The model chosen for the session; empty: the agent's. */
  model = "";
  /** The reasoning effort chosen for the session; empty: the agent's. */
  reasoningEffort = "";
  /** The first message the model sees: the conversation's start after the latest reset. */
  contextFrom = 0;

  /** Takes the choices a replayed log holds. */
  restore(log: ReplayedLog): void {
    if (log.model !== undefined) this.model = log.model;
    if (log.reasoningEffort !== undefined) this.reasoningEffort = log.reasoningEffort;
    if (log.contextFrom !== undefined) this.contextFrom = log.contextFrom;
  }

  /** Applies `c` to a session of `length` messages; returns what changed, for the log (empty: nothing). */
  apply(c: Choice, length: number): ChoiceRecord {
    const changed: ChoiceRecord = {};
    if (c.model && c.model !== this.model) changed.model = this.model = c.model;
    const effort = c.reasoningEffort === "default" ? "" : (c.reasoningEffort ?? "");
    if (c.reasoningEffort && effort !== this.reasoningEffort) changed.reasoningEffort = this.reasoningEffort = effort;
    if (c.reset && this.contextFrom !== length) changed.contextFrom = this.contextFrom = length;
    return changed;
  }
}
