// Tools the agent can call. A tool is a name, a JSON schema for its arguments, and an execute
// function that gets the run's AbortSignal and a way to stream partial output. Tools that touch
// anything outside the runner (shell commands, workspace files) go through the sandbox service:
// nothing the model asks for runs or is written in the runner's own process or file system.
import type { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { Image } from "../../shared/gen/troupe/v1/session_pb.js";
import type { ServiceClient } from "../../shared/rpc.js";
import { identityMetadata, type Identity } from "../../shared/auth/auth.js";
import { grpcCode, Status } from "../../shared/errors.js";

export interface ToolContext {
  sessionId: string;
  agentId: string;
  toolCallId: string;
  signal: AbortSignal;
  /** Partial output, shown to the client as tool_execution_update events. */
  onUpdate(output: string): void;
}

export interface ToolResult {
  output: string;
  isError: boolean;
  /** Images the tool returned (an MCP server's image content), checked: a vision model sees them. */
  images?: Image[];
}

export interface Tool {
  name: string;
  description: string;
  /** JSON schema of the arguments; calls are validated against it before execute runs. */
  parameters: Record<string, unknown>;
  /**
   * Safe to run at the same time as other calls of the same batch (reads, searches). Calls that
   * change something (exec, write_file) run alone, in the order the model gave them.
   */
  parallel?: boolean;
  /** The client runs it (client-tools.ts): a call is sent to the client, not executed here. */
  client?: boolean;
  /** The MCP server it comes from (mcp/mcp-hub.ts); such calls ask for approval unless the policy says otherwise. */
  mcp?: string;
  execute(args: Record<string, unknown>, ctx: ToolContext): Promise<ToolResult>;
}

type SandboxClient = ServiceClient<(typeof SandboxService)["method"]>;

/** Output kept in a tool result (the model sees this much; the client saw all of it streamed). */
export const MAX_RESULT_CHARS = 16_000;

export function clip(text: string): string {
  if (text.length <= MAX_RESULT_CHARS) return text;
  const half = MAX_RESULT_CHARS / 2;
  return `${text.slice(0, half)}\n[... ${text.length - MAX_RESULT_CHARS} characters cut ...]\n${text.slice(-half)}`;
}

/**
 * A failed call to a service a tool uses (`service`: "the sandbox", "memory"), as the model should
 * see it: what failed and why, as the service said.
 */
export function serviceFailure(tool: string, service: string, err: unknown): ToolResult {
  const detail = (err as { details?: string }).details ?? (err as Error).message;
  const hint = grpcCode(err) === Status.UNAVAILABLE ? `${service} is unavailable: ` : "";
  return { output: `${tool} failed: ${hint}${detail}`, isError: true };
}

const sandboxFailure = (tool: string, err: unknown) => serviceFailure(tool, "the sandbox", err);

/** Deadline of a workspace file call. */
const FILE_CALL_TIMEOUT_MS = 30_000;
/** Bytes of a file read_file returns (the model's context is the real limit). */
const READ_LIMIT_BYTES = 256 * 1024;

const pathArg = (tool: string, args: Record<string, unknown>, required: boolean): string => {
  const p = args.path ?? "";
  if (typeof p !== "string" || (required && p.trim() === ""))
    throw new ToolArgumentError(`${tool}: \`path\` must be a non-empty string (relative to the workspace)`);
  return p;
};

class ToolArgumentError extends Error {}

/** A file tool: argument errors and sandbox failures become results the model can act on. */
function fileTool(
  spec: Omit<Tool, "execute">,
  run: (args: Record<string, unknown>, ctx: ToolContext) => Promise<string>,
): Tool {
  return {
    ...spec,
    async execute(args, ctx) {
      try {
        return { output: clip(await run(args, ctx)), isError: false };
      } catch (err) {
        if (err instanceof ToolArgumentError) return { output: err.message, isError: true };
        return sandboxFailure(spec.name, err);
      }
    },
  };
}

/** `read_file`, `write_file`, `list_files`: the session's sandbox workspace. */
export function fileTools(sandbox: SandboxClient, owner: Identity): Tool[] {
  const metadata = identityMetadata(owner);
  const opts = (ctx: ToolContext) => ({ signal: ctx.signal, timeoutMs: FILE_CALL_TIMEOUT_MS, metadata });
  return [
    fileTool(
      {
        name: "read_file",
        parallel: true,
        description: "Read a text file from this session's sandbox workspace (/workspace).",
        parameters: {
          type: "object",
          properties: { path: { type: "string", description: "Path relative to the workspace." } },
          required: ["path"],
          additionalProperties: false,
        },
      },
      async (args, ctx) => {
        const path = pathArg("read_file", args, true);
        const file = await sandbox.readFile(
          { sessionId: ctx.sessionId, agentId: ctx.agentId, path, maxBytes: READ_LIMIT_BYTES },
          opts(ctx),
        );
        const text = Buffer.from(file.data).toString("utf8");
        return file.truncated ? `${text}\n[file is ${file.size} bytes; the first ${file.data.length} are shown]` : text;
      },
    ),
    fileTool(
      {
        name: "write_file",
        description:
          "Write a file in this session's sandbox workspace (/workspace), replacing it if it exists; missing directories are made.",
        parameters: {
          type: "object",
          properties: {
            path: { type: "string", description: "Path relative to the workspace." },
            content: { type: "string", description: "The whole new content." },
            executable: { type: "boolean", description: "Make the file executable (mode 0755)." },
          },
          required: ["path", "content"],
          additionalProperties: false,
        },
      },
      async (args, ctx) => {
        const path = pathArg("write_file", args, true);
        if (typeof args.content !== "string") throw new ToolArgumentError("write_file: `content` must be a string");
        const data = Buffer.from(args.content, "utf8");
        await sandbox.writeFile(
          {
            sessionId: ctx.sessionId,
            agentId: ctx.agentId,
            path,
            data,
            createParents: true,
            mode: args.executable === true ? 0o755 : 0,
          },
          opts(ctx),
        );
        return `wrote ${data.length} bytes to ${path}`;
      },
    ),
    fileTool(
      {
        name: "list_files",
        parallel: true,
        description:
          "List a directory of this session's sandbox workspace (/workspace): name, type and size of each entry.",
        parameters: {
          type: "object",
          properties: {
            path: {
              type: "string",
              description: "Directory relative to the workspace; empty for the workspace itself.",
            },
          },
          additionalProperties: false,
        },
      },
      async (args, ctx) => {
        const path = pathArg("list_files", args, false);
        const { entries, truncated } = await sandbox.listFiles(
          { sessionId: ctx.sessionId, agentId: ctx.agentId, path, maxEntries: 500 },
          opts(ctx),
        );
        const kinds = ["?", "file", "dir", "link", "other"];
        const lines = entries.map((e) => `${kinds[e.type] ?? "?"}\t${e.size}\t${e.name}`);
        if (truncated) lines.push("[more entries not shown]");
        return lines.length ? lines.join("\n") : "(empty)";
      },
    ),
  ];
}

/** `exec`: a shell command in the session's sandbox container. */
/**
 * The sandbox tools of one session's owner: every call names the owner, because the sandbox
 * service keys sandboxes by tenant and principal as well as by session.
 */
/** The agent's way out for its sandboxed commands (agent.json `egress`), sent with each command; undefined: none. */
export type EgressOf = () => Promise<{ allowHosts: string[]; budgetBytes: bigint } | undefined>;

export function execTool(sandbox: SandboxClient, defaultTimeoutMs: number, owner: Identity, egress: EgressOf): Tool {
  const metadata = identityMetadata(owner);
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
      if (typeof command !== "string" || command.trim() === "")
        return { output: "exec: `command` must be a non-empty string", isError: true };
      const timeoutMs =
        typeof args.timeout_ms === "number" && args.timeout_ms > 0 ? Math.floor(args.timeout_ms) : defaultTimeoutMs;
      const call = sandbox.exec(
        { sessionId: ctx.sessionId, agentId: ctx.agentId, command, timeoutMs, egress: await egress() },
        { signal: ctx.signal, metadata },
      );
      let output = "";
      let exit: { exitCode: number; timedOut: boolean; truncated: boolean; oomKilled: boolean } | undefined;
      try {
        for await (const msg of call) {
          const kind = msg.kind;
          if (kind.case === "stdout" || kind.case === "stderr") {
            const text = Buffer.from(kind.value).toString("utf8");
            output += text;
            ctx.onUpdate(text);
          } else if (kind.case === "started" && kind.value.workspaceNote !== "") {
            // The workspace's truth first: the model reads it before the output it explains.
            output += `[${kind.value.workspaceNote}]\n`;
          } else if (kind.case === "exit") {
            exit = kind.value;
          }
        }
      } catch (err) {
        if (ctx.signal.aborted) {
          // Cancelling the call makes the sandbox kill the command too, but in its own time; an
          // aborted call is reported only once its processes are known to be dead.
          const killed = await sandbox
            .killProcesses({ sessionId: ctx.sessionId, agentId: ctx.agentId }, { timeoutMs: 5000, metadata })
            .then(
              () => true,
              () => false,
            );
          return {
            output: clip(
              output +
                (killed
                  ? "\n[aborted: the command and everything it started were killed]"
                  : "\n[aborted; the sandbox did not confirm the kill]"),
            ),
            isError: true,
          };
        }
        return sandboxFailure("exec", err);
      }
      if (!exit) return { output: clip(`${output}\n[no exit status]`), isError: true };
      const notes = [
        exit.timedOut ? `timed out after ${timeoutMs} ms` : "",
        exit.oomKilled ? "killed: out of memory" : "",
        exit.truncated ? "output truncated" : "",
      ].filter(Boolean);
      const trailer = `[exit ${exit.exitCode}${notes.length ? `; ${notes.join("; ")}` : ""}]`;
      return {
        output: clip(output.length > 0 ? `${output.replace(/\n$/, "")}\n${trailer}` : trailer),
        isError: exit.exitCode !== 0 || exit.timedOut,
      };
    },
  };
}
