// The Exec stream: one command in the caller's sandbox, its output streamed with backpressure
// (the agent sends at most a window ahead of what the caller has taken), its end reported with
// the exit code, timeout, truncation and whether the engine saw an OOM kill. The caller hanging
// up kills the sandbox's commands; an agent that does not end a command at its timeout loses its
// container.
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { ExecResponseSchema, type ExecRequest, type ExecResponse } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { instruments, secondsSince } from "../shared/process/metrics.js";
import type { grpc } from "../shared/rpc.js";
import type { CallContext } from "../shared/rpc/call-context.js";
import { AgentError, type AgentExit, type RunningExec } from "./agent-connection.js";
import type { SandboxFleet, Sandbox } from "./fleet.js";
import type { WorkspaceStart } from "./workspaces/templates.js";
import { takeNote } from "./workspaces/workspace-saves.js";
import { identityOf } from "../shared/auth/auth.js";
import { DEFAULT_EGRESS_BUDGET, DEFAULT_OUTPUT_BYTES, agentStatus, validateExec } from "./requests.js";

/** Output the agent may send ahead of what the caller has taken. */
const OUTPUT_WINDOW_BYTES = 256 * 1024;

/** A command while it runs, by the id its caller got (for WriteStdin and SignalExec). */
export interface RunningCommand {
  key: string;
  exec: RunningExec;
  agent: Sandbox["agent"];
  stdinOpen: boolean;
}

/** What an Exec call needs of the service: each as server.ts defines it. */
export interface ExecDeps {
  fleet: SandboxFleet;
  running: Map<string, RunningCommand>;
  /** The command's default timeout. */
  execTimeoutMs: number;
  /** How long past its timeout the agent has to report a command's end. */
  killTimeoutMs: number;
  /** Whose sandbox the request is for; INVALID_ARGUMENT for a malformed id. */
  scopeKey(req: ExecRequest, call: { metadata: grpc.Metadata }): string;
  /** What a new sandbox for the request's agent is made from (templates.ts). */
  startOf(req: ExecRequest, call: { metadata: grpc.Metadata }): WorkspaceStart;
  /** UNAVAILABLE when no engine answers. */
  requireEngine(): Promise<void>;
  /** RESOURCE_EXHAUSTED when the key would be a new sandbox over its tenant's quota. */
  requireRoom(key: string, call: { metadata: grpc.Metadata }): void;
  /** Kills every command in the sandbox (or removes it, if its agent does not confirm). */
  killAll(sandbox: Sandbox): Promise<void>;
}

/** SandboxService.Exec. */
export function execHandler(deps: ExecDeps): (req: ExecRequest, ctx: CallContext) => AsyncIterable<ExecResponse> {
  const { fleet, running, scopeKey, requireEngine, requireRoom, killAll } = deps;
  return async function* (req, ctx) {
    const key = scopeKey(req, ctx);
    validateExec(req);
    const hosts = req.egress?.allowHosts ?? [];
    await requireEngine();
    const timeoutMs = req.timeoutMs || deps.execTimeoutMs;

    // Output waits here for the caller; the agent sends at most a window ahead of it.
    const queue: { stream: "stdout" | "stderr"; data: Buffer }[] = [];
    let outcome: { exit: AgentExit } | { lost: Error } | undefined;
    let wake: (() => void) | undefined;
    const handlers = {
      output: (stream: "stdout" | "stderr", data: Buffer) => (queue.push({ stream, data }), wake?.()),
      exit: (exit: AgentExit) => ((outcome = { exit }), wake?.()),
      lost: (err: Error) => ((outcome = { lost: err }), wake?.()),
    };
    const options = {
      timeoutMs,
      maxOutputBytes: req.maxOutputBytes || DEFAULT_OUTPUT_BYTES,
      windowBytes: OUTPUT_WINDOW_BYTES,
      stdin: req.stdin,
      openStdin: req.openStdin,
      proxy: hosts.length > 0,
    };
    // get() hands out only sandboxes whose agent connection is alive; one that dies from here
    // on reports the command as lost (killed), below.
    requireRoom(key, ctx);
    const sandbox = await fleet.get(key, () => deps.startOf(req, ctx));
    // This command's grant is the sandbox's from now on (its budget runs over the sandbox's life).
    sandbox.agent.egress.hosts = hosts;
    sandbox.agent.egress.budgetBytes = Number(req.egress?.budgetBytes || DEFAULT_EGRESS_BUDGET);
    const exec = sandbox.agent.exec(req.command, options, handlers);
    sandbox.lastUsed = Date.now();
    // A monotonic clock: a wall-clock step (NTP) must not make a command's duration negative.
    const started = performance.now();
    const oomsBefore = fleet.ooms(sandbox.id);
    const execId = randomUUID();
    running.set(execId, { key, exec, agent: sandbox.agent, stdinOpen: req.openStdin });

    let cancelled = false;
    let fellBack = false;
    // Only while the command runs: the call ending after it (its status sent) must not kill
    // the sandbox's other commands.
    const onCancelled = () => {
      cancelled = true;
      wake?.();
      void killAll(sandbox);
    };
    ctx.signal.addEventListener("abort", onCancelled, { once: true });
    // The agent ends a command at its timeout; if it has not reported by a while after, it is
    // not trusted to, and the container goes.
    const fallback = setTimeout(() => {
      fellBack = true;
      void fleet.discard(sandbox, "its agent did not end a command at its timeout");
    }, timeoutMs + deps.killTimeoutMs);
    try {
      const note = takeNote(sandbox);
      yield create(ExecResponseSchema, { kind: { case: "started", value: { execId, workspaceNote: note } } });
      while (!cancelled) {
        const part = queue.shift();
        if (part) {
          // The next is asked for once the stream took this one: that is the caller's credit.
          yield create(ExecResponseSchema, { kind: { case: part.stream, value: part.data } });
          exec.credit(part.data.length);
        } else if (outcome) break;
        else await new Promise<void>((resolve) => (wake = resolve));
      }
    } finally {
      clearTimeout(fallback);
      running.delete(execId);
      fleet.used(sandbox, identityOf(ctx.metadata).tenant);
      ctx.signal.removeEventListener("abort", onCancelled);
      // Left at a response (the caller went while its stream was full): the command goes too.
      if (ctx.signal.aborted && !cancelled) onCancelled();
    }
    if (cancelled) return;

    let exit: AgentExit;
    if ("lost" in outcome!) {
      // A command that could not start is the caller's error to see; one whose sandbox ended
      // under it (killed by the engine, or by us) reports as killed.
      if (outcome.lost instanceof AgentError) throw agentStatus(outcome.lost, "exec");
      exit = { exitCode: 137, signal: 9, timedOut: fellBack, truncated: false };
    } else exit = outcome!.exit;
    // A SIGKILL we did not send: give the engine's OOM event time to arrive (it comes on the
    // events stream, late when the machine is busy: 250 ms once missed it under load).
    const oomDeadline = Date.now() + 2000;
    while (exit.exitCode === 137 && !exit.timedOut && fleet.ooms(sandbox.id) === oomsBefore && Date.now() < oomDeadline)
      await new Promise((r) => setTimeout(r, 50));
    const ended = exit.timedOut ? "timeout" : exit.exitCode === 0 ? "ok" : exit.exitCode === 137 ? "killed" : "failed";
    instruments().execDuration.record(secondsSince(started), { "troupe.exec.outcome": ended });
    yield create(ExecResponseSchema, {
      kind: {
        case: "exit",
        value: {
          exitCode: exit.exitCode,
          timedOut: exit.timedOut,
          truncated: exit.truncated,
          oomKilled: fleet.ooms(sandbox.id) > oomsBefore,
          durationMs: Math.round(performance.now() - started),
        },
      },
    });
  };
}
