// A run's start: everything the loop (loop.ts) settles once before the first step, and the
// system prompt's rebuild when steering or follow-ups change the question. The loop's steps read
// the Turn this returns; nothing here runs a model or a tool.
import { ROOT_CONTEXT } from "@opentelemetry/api";
import { FrameKind, Role, type ChatMessage, type Usage } from "../../shared/gen/troupe/v1/session_pb.js";
import { sessionModel, toolOffered, type AgentConfig } from "../agent-config.js";
import { asTools } from "../tools/client-tools.js";
import { failpoint } from "./failpoints.js";
import { triggerOf } from "../../shared/frames.js";
import { DRIFT_THRESHOLD } from "./context.js";
import type { TurnInfo } from "./hooks.js";
import {
  answerUnanswered,
  hookFailed,
  report,
  unansweredCalls,
  type QueuedMessage,
  type RunDeps,
  type RunHost,
  type Turn,
} from "./run.js";
import type { TokenCounter } from "./tokens.js";

/** A run that goes on: where its messages begin in the history (recovery.ts cutRunOf), and why. */
export interface Resume {
  from: number;
  /** Calls that were running when the runner died: answered as interrupted, not run again. */
  interrupted: readonly string[];
  /** The run had stopped to wait on decisions (RunWaiting), and goes on because the wait ended. */
  afterWait?: boolean;
}

/**
 * What a run works with before its first step: the agent's configuration and tools, the model
 * chain (hooks may change the first), the system prompt and its budget, the tenant's per-run
 * quotas. Emits agent_start, or run_resumed for a resumed run, before any warning it reports.
 */
export async function startTurn(
  host: RunHost,
  deps: RunDeps,
  info: TurnInfo,
  initial: readonly QueuedMessage[],
  usage: Usage,
  resume?: Resume,
): Promise<Turn> {
  // A resumed run answers the last message it had taken.
  const asked = resume ? resumedMessages(host.messages, resume.from) : initial;
  const query = asked.map((q) => q.text).join("\n");
  // The model is settled before agent_start, which names it; what went wrong on the way follows it.
  const { config: configured, error } = await deps.agent();
  // A session's own reasoning effort (/think) stands in for its agent's; each model still gets it
  // only if it takes that value (model-rules.ts).
  // The prompt that started the run may set its own temperature and reply length (Prompt.sampling).
  const sampling = initial[0]?.sampling;
  const agent: AgentConfig = {
    ...configured,
    ...(host.reasoningEffort ? { reasoningEffort: host.reasoningEffort as AgentConfig["reasoningEffort"] } : {}),
    ...(sampling?.temperature !== undefined ? { temperature: sampling.temperature } : {}),
    ...(sampling?.maxOutputTokens !== undefined ? { maxOutputTokens: sampling.maxOutputTokens } : {}),
  };
  // Tools the agent's configuration leaves out are neither offered nor callable in this run; the
  // client's are offered beside the rest (a name the agent's tools have was refused when declared).
  const own = deps.tools.filter((t) => toolOffered(agent, t.name));
  const clients = asTools(host.clientTools.filter((c) => !own.some((t) => t.name === c.name)));
  deps = { ...deps, tools: [...own, ...clients] };
  const chosen = sessionModel(deps.agentId, agent, deps.defaultModel, host.model);
  const resolved = await deps.hooks.modify("before_model_resolve", { ...info, model: chosen.model }, (p, r) => ({
    payload: r.model ? { ...p, model: r.model } : p,
  }));
  const models = [...new Set([resolved.payload.model, ...agent.fallbacks])];
  if (resume) {
    const running = new Set(resume.interrupted);
    const interrupted = unansweredCalls(host.messages)
      .map((c) => c.id)
      .filter((id) => running.has(id));
    host.emit({
      case: "runResumed",
      value: { model: models[0], interruptedToolCallIds: interrupted, afterWait: resume.afterWait === true },
    });
    answerUnanswered(host.emit, host.messages, INTERRUPTED_CALL, running);
  } else {
    const trigger = triggerOf(initial[0].frameId);
    host.emit({
      case: "agentStart",
      value: {
        agentId: deps.agentId,
        model: models[0],
        frameId: initial[0].frameId,
        trigger,
        originFrameId: trigger ? await deps.triggerOrigin(trigger) : "",
      },
    });
  }
  if (error) report(host, "AGENT_CONFIG", error);
  if (deps.externalTools) {
    // The agent's MCP servers' tools, connected now if not yet (a server that fails says why).
    const external = await deps.externalTools(agent);
    for (const w of external.warnings) report(host, "MCP_SERVER", w);
    const taken = new Set(deps.tools.map((t) => t.name));
    deps = { ...deps, tools: [...deps.tools, ...external.tools.filter((t) => !taken.has(t.name))] };
  }
  if (chosen.refused) report(host, "AGENT_CONFIG", `${chosen.refused}; this run uses ${chosen.model}`);
  resolved.failures.forEach(hookFailed(host));
  failpoint("runner.run", query);
  const extra = initial.map((q) => q.instruction ?? "").filter((s) => s.trim() !== "");
  const built = await deps.hooks.modify("before_prompt_build", { ...info, query }, (p, r) => {
    if (typeof r.instruction === "string" && r.instruction.trim() !== "") extra.push(r.instruction);
    return { payload: p };
  });
  built.failures.forEach(hookFailed(host));
  const tokens = await deps.tokens(models[0]);
  const tools = deps.tools.map(({ name, description, parameters }) => ({ name, description, parameters }));
  const { budget, toolTokens } = await systemBudget(agent, tokens, tools);
  const prompt = { agent, ephemeral: extra, tokens, budget };
  const system = await systemFor(host, deps, prompt, query, asked[0]?.speaker);
  for (const w of system.warnings) report(host, w.code, w.message);
  const q = deps.runQuotas?.();
  const allowed = {
    steps: q?.stepsPerRun ?? Number.POSITIVE_INFINITY,
    toolCalls: q?.toolCallsPerRun ?? Number.POSITIVE_INFINITY,
  };
  return {
    host,
    deps,
    info,
    agent,
    models,
    modelAt: 0,
    tokens,
    system,
    tools,
    prompt,
    budget: allowed,
    fixedTokens: system.tokens + toolTokens,
    usage,
  };
}

/** What a tool call left running when its runner died is told: it is not run again blindly. */
const INTERRUPTED_CALL =
  "Interrupted: the runner stopped while this call ran, and the run went on after a restart. It may or may not have taken effect; check before running it again.";

/** The user messages a resumed run had taken (from its start in the history), as queued messages. */
export function resumedMessages(messages: readonly ChatMessage[], from: number): QueuedMessage[] {
  return messages
    .slice(from)
    .filter((m) => m.role === Role.USER)
    .map((m) => ({
      frameId: m.frameId,
      kind: FrameKind.PROMPT,
      text: m.text,
      traceContext: ROOT_CONTEXT,
      ...(m.speaker ? { speaker: { id: m.speaker.id, displayName: m.speaker.displayName } } : {}),
    }));
}

/** The system prompt for `query`, asked by `speaker`: memories recalled for it, the time now. */
function systemFor(
  host: RunHost,
  deps: RunDeps,
  prompt: Turn["prompt"],
  query: string,
  speaker: QueuedMessage["speaker"],
) {
  const conversation =
    host.conversationBefore + host.messages.filter((m) => m.role === Role.USER || m.role === Role.ASSISTANT).length;
  return deps.systemPrompt({ ...prompt, query, speaker, driftReminder: conversation >= DRIFT_THRESHOLD }, host.signal);
}

/** Builds the run's system prompt again for new messages; what the first build warned of is not repeated. */
export async function refreshSystem(turn: Turn, messages: readonly QueuedMessage[]): Promise<void> {
  const query = messages.map((q) => q.text).join("\n");
  const system = await systemFor(turn.host, turn.deps, turn.prompt, query, messages.at(-1)?.speaker);
  turn.fixedTokens += system.tokens - turn.system.tokens;
  turn.system = system;
}

/**
 * What the system prompt may take (and the tools' count): half of what the window leaves past
 * the reserve and the tools' schemas. By the bound the schemas can count several times their
 * size; where that alone would take a quarter of the room (a small window, many tools), they are
 * counted exactly, so the prompt is not cut on the bound's word.
 */
async function systemBudget(
  agent: AgentConfig,
  tokens: TokenCounter,
  tools: readonly object[],
): Promise<{ budget: number; toolTokens: number }> {
  const room = agent.contextWindow - agent.reserveTokens;
  let toolTokens = tokens.tools(tools);
  if (!tokens.isExact && toolTokens > room / 4) {
    await tokens.exact();
    toolTokens = tokens.tools(tools);
  }
  return { budget: Math.max(256, Math.floor((room - toolTokens) / 2)), toolTokens };
}
