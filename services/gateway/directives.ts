// Directives typed into a chat and delivered by an adapter: /new and /reset (start the conversation
// over), /model provider/model, /think minimal|low|medium|high|default, /status. They act only when
// the adapter says the sender may use commands (as /stop does), never reach the model, and are
// answered with a line for the chat (DeliverResponse.directive_reply). Anything else that starts
// with a slash is an ordinary message. "/status@mybot" (Telegram's form in groups) is /status.
import type { Config } from "../shared/config/config-types.js";
import { Status, grpcCode } from "../shared/errors.js";
import { SESSION_EFFORTS } from "../shared/frames.js";
import type { RunnerService } from "../shared/gen/troupe/v1/runner_pb.js";
import { QueueMode, type OpenSession, type SessionOpened } from "../shared/gen/troupe/v1/session_pb.js";
import type { grpc, ServiceClient } from "../shared/rpc.js";

export type Directive =
  | { kind: "reset" }
  | { kind: "model"; model: string }
  | { kind: "think"; effort: string }
  | { kind: "status" }
  /** A directive used wrongly: answered with this, nothing changes. */
  | { kind: "usage"; reply: string };

const WORD = /^\/([a-z]+)(?:@[A-Za-z0-9_]+)?(?:\s+([\s\S]*))?$/;

export function parseDirective(text: string): Directive | undefined {
  const m = WORD.exec(text.trim());
  if (!m) return undefined;
  const [, word, rest = ""] = m;
  const arg = rest.trim();
  switch (word) {
    case "new":
    case "reset":
      return { kind: "reset" };
    case "status":
      return { kind: "status" };
    case "model":
      if (!/^\S{1,200}$/.test(arg)) return { kind: "usage", reply: "usage: /model provider/model" };
      return { kind: "model", model: arg };
    case "think": {
      const effort = arg.toLowerCase() === "off" ? "default" : arg.toLowerCase();
      if (!(SESSION_EFFORTS as readonly string[]).includes(effort))
        return { kind: "usage", reply: `usage: /think ${SESSION_EFFORTS.join("|")} (or off)` };
      return { kind: "think", effort };
    }
    default:
      return undefined;
  }
}

/** What the open that carries out a directive sets on the session. */
export function openFor(d: Directive): Partial<Pick<OpenSession, "model" | "reasoningEffort" | "reset">> {
  if (d.kind === "reset") return { reset: true };
  if (d.kind === "model") return { model: d.model };
  if (d.kind === "think") return { reasoningEffort: d.effort };
  return {};
}

/** The line the chat gets back once the directive took effect. */
export function replyFor(d: Directive, s: SessionOpened, deleted: boolean): string {
  if (d.kind === "reset")
    return deleted
      ? "Started a new conversation; the old one was deleted."
      : "Started a new conversation; the old one stays in the history.";
  if (d.kind === "model") return `Model set to ${s.model}.`;
  if (d.kind === "think")
    return s.reasoningEffort
      ? `Reasoning effort set to ${s.reasoningEffort}.`
      : "Reasoning effort back to the agent's.";
  const u = s.usage;
  return [
    `agent ${s.agentId}, model ${s.model || "the agent's own"}, reasoning effort ${s.reasoningEffort || "the agent's"}`,
    `queue mode ${QUEUE_NAMES[s.queueMode] ?? "the default"}: ${s.running ? "a run is going" : "idle"}, ${s.queued} waiting`,
    `${s.messagesInContext} of ${s.messageCount} messages in context; tokens ${u?.inputTokens ?? 0} in, ${u?.outputTokens ?? 0} out`,
  ].join("\n");
}

const QUEUE_NAMES: Partial<Record<QueueMode, string>> = {
  [QueueMode.COLLECT]: "collect",
  [QueueMode.FOLLOWUP]: "followup",
  [QueueMode.STEER]: "steer",
  [QueueMode.INTERRUPT]: "interrupt",
  [QueueMode.REJECT]: "reject",
};

type RunnerClient = ServiceClient<(typeof RunnerService)["method"]>;

/**
 * Carries out a directive on the session (made if this is its key's first message) and says what
 * to answer. A model the agent does not allow is answered, not an error of the call.
 */
export async function carryOut(
  directive: Directive,
  runner: RunnerClient,
  metadata: grpc.Metadata,
  channelReset: Config["channelReset"],
  ensure: { open: { sessionId: string; agentId: string; create: boolean; queueMode: QueueMode }; memoryOwner: string },
): Promise<string> {
  if (directive.kind === "usage") return directive.reply;
  let deleted = false;
  if (directive.kind === "reset" && channelReset === "delete") {
    deleted = await runner.deleteStoredSession({ sessionId: ensure.open.sessionId }, { metadata }).then(
      () => true,
      (err: unknown) => {
        if (grpcCode(err) === Status.NOT_FOUND) return false;
        throw err;
      },
    );
  }
  try {
    const res = await runner.ensureSession(
      { ...ensure, open: { ...ensure.open, ...openFor(directive) } },
      { metadata },
    );
    return replyFor(directive, res.session!, deleted);
  } catch (err) {
    if (grpcCode(err) === Status.INVALID_ARGUMENT)
      return `Not changed: ${(err as { details?: string }).details ?? (err as Error).message}`;
    throw err;
  }
}
