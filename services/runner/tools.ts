// Tools the agent can call. A tool is a name, a JSON schema for its arguments, and an execute
// function that gets the run's AbortSignal and a way to stream partial output. Tools that touch
// anything outside the runner (shell commands above all) go through the sandbox service.
import { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient } from "../shared/rpc.js";
import { grpcCode, Status } from "../shared/errors.js";

export interface ToolContext {
  sessionId: string;
  toolCallId: string;
  signal: AbortSignal;
  /** Partial output, shown to the client as tool_execution_update events. */
  onUpdate(output: string): void;
}

export interface ToolResult {
  output: string;
  isError: boolean;
}

export interface Tool {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
  execute(args: Record<string, unknown>, ctx: ToolContext): Promise<ToolResult>;
}

type SandboxClient = ServiceClient<(typeof SandboxService)["method"]>;

/** Output kept in a tool result (the model sees this much; the client saw all of it streamed). */
const MAX_RESULT_CHARS = 16_000;

function clip(text: string): string {
  if (text.length <= MAX_RESULT_CHARS) return text;
  const half = MAX_RESULT_CHARS / 2;
  return `${text.slice(0, half)}\n[... ${text.length - MAX_RESULT_CHARS} characters cut ...]\n${text.slice(-half)}`;
}

/** `exec`: a shell command in the session's sandbox container. */
export function execTool(sandbox: SandboxClient, defaultTimeoutMs: number): Tool {
  return {
    name: "exec",
    description: "Run a shell command (/bin/sh -c) in this session's sandbox and return its output and exit code.",
    parameters: {
      type: "object",
      properties: {
        command: { type: "string", description: "The shell command to run." },
        timeout_ms: { type: "integer", minimum: 1, description: "Kill the command after this long." },
      },
      required: ["command"],
      additionalProperties: false,
    },
    async execute(args, ctx) {
      const command = args.command;
      if (typeof command !== "string" || command.trim() === "") return { output: "exec: `command` must be a non-empty string", isError: true };
      const timeoutMs = typeof args.timeout_ms === "number" && args.timeout_ms > 0 ? Math.floor(args.timeout_ms) : defaultTimeoutMs;
      const call = sandbox.exec({ sessionId: ctx.sessionId, command, timeoutMs }, { signal: ctx.signal });
      let output = "";
      let exit: { exitCode: number; timedOut: boolean; truncated: boolean; oomKilled: boolean } | undefined;
      try {
        for await (const msg of call) {
          const kind = msg.kind;
          if (kind.case === "stdout" || kind.case === "stderr") {
            const text = Buffer.from(kind.value).toString("utf8");
            output += text;
            ctx.onUpdate(text);
          } else if (kind.case === "exit") {
            exit = kind.value;
          }
        }
      } catch (err) {
        if (ctx.signal.aborted) {
          // Cancelling the call makes the sandbox kill the command too, but in its own time; an
          // aborted call is reported only once its processes are known to be dead.
          const killed = await sandbox.killProcesses({ sessionId: ctx.sessionId }, { timeoutMs: 5000 }).then(
            () => true,
            () => false,
          );
          return { output: clip(output + (killed ? "\n[aborted: the command and everything it started were killed]" : "\n[aborted; the sandbox did not confirm the kill]")), isError: true };
        }
        const code = grpcCode(err);
        const detail = (err as { details?: string }).details ?? (err as Error).message;
        const hint = code === Status.UNAVAILABLE ? "the sandbox is unavailable: " : "";
        return { output: `exec failed: ${hint}${detail}`, isError: true };
      }
      if (!exit) return { output: clip(output + "\n[no exit status]"), isError: true };
      const notes = [
        exit.timedOut ? `timed out after ${timeoutMs} ms` : "",
        exit.oomKilled ? "killed: out of memory" : "",
        exit.truncated ? "output truncated" : "",
      ].filter(Boolean);
      const trailer = `[exit ${exit.exitCode}${notes.length ? "; " + notes.join("; ") : ""}]`;
      return { output: clip(output.length > 0 ? `${output.replace(/\n$/, "")}\n${trailer}` : trailer), isError: exit.exitCode !== 0 || exit.timedOut };
    },
  };
}
