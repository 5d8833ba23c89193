// What a run's system prompt is built from (context.ts builds it, identity.ts writes its last
// block): plain data, imported by both, so neither imports the other for its types.
import type { SessionRef } from "../../shared/session-ref.js";
import type { AgentConfig } from "../agent-config.js";
import type { Recalled } from "../memory/memory-recall.js";

/** Who is speaking in the session, as far as context goes. */
export interface Sender {
  /** The agent's owner gets the profile and every memory; anyone else is an external sender. */
  isOwner: boolean;
  /** A name for the sender (principal or channel identity). */
  id: string;
  /** How their channel names them, when it said. */
  displayName?: string;
  tenant: string;
}

export interface PromptInput {
  agentId: string;
  agent: AgentConfig;
  sessionId: string;
  /** The session as its owner names it: where its own workspace folder is. */
  session: SessionRef;
  channel: string;
  sender: Sender;
  tools: readonly { name: string; description: string }[];
  memories: readonly Recalled[];
  /** Per-turn instruction (a sub-agent's task, a trigger, hook additions). */
  ephemeral: string[];
  /** Sub-agents run without workspace files or the profile. */
  skipContextFiles: boolean;
  /** The conversation has reached DRIFT_THRESHOLD messages. */
  driftReminder: boolean;
  now: Date;
  /** Who shares the session's sandbox (TROUPE_SANDBOX_SCOPE, the deployment's). */
  sandboxScope: "session" | "agent" | "shared";
  /** The sandbox service keeps workspaces past their containers (TROUPE_SANDBOX_WORKSPACES=kept). */
  workspacesKept?: boolean;
}

/** Something in the context sources that could not be used as it was; the run says so by event. */
export interface ContextWarning {
  code: "CONTEXT_FILE" | "CONTEXT_TRIMMED";
  message: string;
}
