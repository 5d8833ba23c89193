// Sub-agents: the `delegate_task` tool starts a child session for an isolated task and returns
// what the child answered, as plain text. The child is an ordinary session actor (its own log,
// its own sandbox workspace) with:
//   - an ephemeral instruction (the task's) in its system prompt, and no workspace files;
//   - quiet mode: its events stay in its own session, the parent's client sees only the tool call;
//   - the parent's owner, so the parent's principal may read the child's history;
//   - limits: depth (a child may delegate only while under subagents.maxDepth) and children
//     running at once per parent (subagents.maxChildren).
// Aborting the parent's run aborts the child's: the tool's signal carries it over.
import { create } from "@bufbuild/protobuf";
import { ClientFrameSchema, Role, StopReason, type AgentEvent } from "../../shared/gen/troupe/v1/session_pb.js";
import { newId } from "../../shared/ids.js";
import type { AgentConfig } from "../agent-config.js";
import type { EventSubscriber } from "../session/event-journal.js";
import type { SessionActor } from "../session/session-actor.js";
import type { Subagent } from "../session/session-log.js";
import { refKey } from "../../shared/session-ref.js";
import type { Tool } from "./tools.js";

export interface Delegation {
  parent: SessionActor;
  /** The agent's settings (subagents limits), read when the tool runs. */
  agent(): Promise<AgentConfig>;
  /** Makes the child session (registered like any other). */
  createChild(sessionId: string, subagent: Subagent): Promise<SessionActor>;
  /** Children running now, per parent session by refKey (the runner's; the limit counts these). */
  running: Map<string, number>;
  /** Sub-agents one run may start in all (the tenant's subagentsPerRun quota). */
  perRun: number;
}

const MAX_TASK_CHARS = 16_000;
/** After an abort, how long the tool waits for the child's run to end before giving up on it. */
const ABORT_GRACE_MS = 5000;

/** The tool for one run of `d.parent` (the runner makes the tools anew for every run). */
export function delegateTool(d: Delegation): Tool {
  const running = d.running;
  const depth = (d.parent.subagent?.depth ?? 0) + 1;
  const parentKey = refKey(d.parent.ref);
  let startedThisRun = 0;
  return {
    name: "delegate_task",
    // Children of one batch work side by side (up to subagents.maxChildren).
    parallel: true,
    description:
      "Hand an isolated task to a sub-agent and get its final answer as text. The sub-agent starts with no conversation history, " +
      "has its own sandbox workspace and the same tools; give it everything it needs in `task` and `instructions`.",
    parameters: {
      type: "object",
      properties: {
        task: {
          type: "string",
          minLength: 1,
          maxLength: MAX_TASK_CHARS,
          description: "What the sub-agent must do; its first message.",
        },
        instructions: {
          type: "string",
          maxLength: MAX_TASK_CHARS,
          description: "How to work and what to return (added to its system prompt for this task).",
        },
      },
      required: ["task"],
      additionalProperties: false,
    },
    async execute(args, ctx) {
      if (startedThisRun >= d.perRun)
        return {
          output: `delegate_task refused: this run has started ${startedThisRun} sub-agents, its quota (subagentsPerRun). Do the rest yourself.`,
          isError: true,
        };
      startedThisRun++;
      // The slot is taken before anything is awaited: calls of one batch start together.
      const slot = (running.get(parentKey) ?? 0) + 1;
      running.set(parentKey, slot);
      try {
        const { maxDepth, maxChildren, timeoutMs } = (await d.agent()).subagents;
        if (depth > maxDepth)
          return {
            output: `delegate_task refused: sub-agents may nest ${maxDepth} level(s) deep and this session is already at depth ${depth - 1}. Do the task yourself.`,
            isError: true,
          };
        if (slot > maxChildren)
          return {
            output: `delegate_task refused: ${slot - 1} sub-agents of this session are already running (limit ${maxChildren}). Wait for one to finish.`,
            isError: true,
          };
        const childId = `${d.parent.sessionId.slice(0, 100)}:sub:${newId().slice(0, 12)}`;
        const instruction = [
          "You are a sub-agent working on one task for another agent. Work on the task alone; nobody will answer questions.",
          "Reply with the result only, as plain text: it is handed back verbatim.",
          typeof args.instructions === "string" ? args.instructions : "",
        ]
          .filter((s) => s !== "")
          .join("\n");
        const child = await d.createChild(childId, { parentSessionId: d.parent.sessionId, depth, instruction });
        ctx.onUpdate(`sub-agent session ${childId} started\n`);
        return await runChild(
          child,
          String(args.task),
          AbortSignal.any([ctx.signal, AbortSignal.timeout(timeoutMs)]),
          timeoutMs,
        );
      } finally {
        const left = (running.get(parentKey) ?? 1) - 1;
        if (left <= 0) running.delete(parentKey);
        else running.set(parentKey, left);
      }
    },
  };
}

/** Submits the task, waits for the child's run to end, and returns its last reply. */
async function runChild(
  child: SessionActor,
  task: string,
  signal: AbortSignal,
  timeoutMs: number,
): Promise<{ output: string; isError: boolean }> {
  const frameId = `delegate:${newId()}`;
  let resolveEnd!: (e: AgentEvent) => void;
  const ended = new Promise<AgentEvent>((r) => (resolveEnd = r));
  let mine = false;
  const watcher: EventSubscriber = {
    send(e) {
      if (e.payload.case === "agentStart" && e.payload.value.frameId === frameId) mine = true;
      else if (e.payload.case === "agentEnd" && mine) resolveEnd(e);
      else if (e.payload.case === "messageBlocked" && e.payload.value.frameId === frameId) resolveEnd(e);
    },
    pressure: () => undefined,
    close: () => undefined,
  };
  await child.attach(watcher);
  const timedOut = () => signal.reason instanceof Error && signal.reason.name === "TimeoutError";
  const onAbort = () => {
    void child
      .submit(
        create(ClientFrameSchema, {
          frameId: `${frameId}:abort`,
          kind: {
            case: "abort",
            value: {
              reason: timedOut() ? `sub-agent timed out after ${timeoutMs} ms` : "the parent run was aborted",
              clearQueue: true,
            },
          },
        }),
      )
      .catch(() => undefined);
  };
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    await child.submit(create(ClientFrameSchema, { frameId, kind: { case: "prompt", value: { text: task } } }));
    if (signal.aborted) onAbort();
    // The child's run ends at the abort; if it never got going, stop waiting a little after.
    const gaveUp = new Promise<undefined>((resolve) => {
      const later = () => setTimeout(() => resolve(undefined), ABORT_GRACE_MS).unref();
      if (signal.aborted) later();
      else signal.addEventListener("abort", later, { once: true });
    });
    const end = await Promise.race([ended, gaveUp]);
    if (!end)
      return {
        output: `The sub-agent (session ${child.sessionId}) did not finish: its run ${signal.aborted ? "was stopped" : "ended"} before it answered.`,
        isError: true,
      };
    if (end.payload.case === "messageBlocked")
      return { output: `The sub-agent refused the task: ${end.payload.value.reason}`, isError: true };
    const stop = end.payload.case === "agentEnd" ? end.payload.value : undefined;
    const reply =
      [...child.history.messages].reverse().find((m) => m.role === Role.ASSISTANT && m.text.trim() !== "")?.text ?? "";
    if (stop && stop.stopReason !== StopReason.COMPLETED) {
      const why = signal.aborted
        ? timedOut()
          ? `timed out after ${timeoutMs} ms`
          : "was aborted"
        : `failed: ${stop.errorMessage || "no reason given"}`;
      return {
        output: `The sub-agent (session ${child.sessionId}) ${why}.${reply ? ` Its last reply:\n${reply}` : ""}`,
        isError: true,
      };
    }
    return { output: reply || "(the sub-agent finished without a reply)", isError: false };
  } finally {
    signal.removeEventListener("abort", onAbort);
    child.detach(watcher);
  }
}
