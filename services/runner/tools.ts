// Tools the agent can call. A tool is a name, a JSON schema for its arguments, and an execute
// function that gets the run's AbortSignal and a way to stream partial output. Tools that touch
// anything outside the runner (shell commands, workspace files) go through the sandbox service:
// nothing the model asks for runs or is written in the runner's own process or file system.
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  AddOutcome,
  MemoryKind,
  type MemoryScopeSchema,
  type MemoryService,
} from "../shared/gen/troupe/v1/memory_pb.js";
import type { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient } from "../shared/rpc.js";
import { identityMetadata, type Identity } from "../shared/auth.js";
import { grpcCode, Status } from "../shared/errors.js";

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
function serviceFailure(tool: string, service: string, err: unknown): ToolResult {
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

type MemoryClient = ServiceClient<(typeof MemoryService)["method"]>;
type MemoryScopeInit = MessageInitShape<typeof MemoryScopeSchema>;

const memoryFailure = (tool: string, err: unknown) => serviceFailure(tool, "memory", err);

/**
 * `memory_search`, `memory_save`, `memory_forget`: the long-term memory of the session's owner
 * (its memory owner for channel sessions). `onSaved` lets the runner's recall forget that the
 * scope was empty.
 */
export function memoryTools(
  memory: MemoryClient,
  scope: MemoryScopeInit,
  agentId: string,
  onSaved: () => void,
): Tool[] {
  const opts = (ctx: ToolContext) => ({ signal: ctx.signal, timeoutMs: 10_000 });
  return [
    {
      name: "memory_search",
      parallel: true,
      description:
        "Search your long-term memory of this user by meaning and by words; returns the most relevant memories with their ids.",
      parameters: {
        type: "object",
        properties: { query: { type: "string" }, k: { type: "integer", minimum: 1, maximum: 20 } },
        required: ["query"],
        additionalProperties: false,
      },
      async execute(args, ctx) {
        if (typeof args.query !== "string" || args.query.trim() === "")
          return { output: "memory_search: `query` must be a non-empty string", isError: true };
        const k = typeof args.k === "number" ? Math.min(20, Math.max(1, Math.floor(args.k))) : 5;
        try {
          const { results } = await memory.searchMemories({ scope, query: args.query, k }, opts(ctx));
          return {
            output: results.length
              ? results.map((r) => `${r.memory!.id}: ${r.memory!.text} (score ${r.score.toFixed(2)})`).join("\n")
              : "(nothing remembered that matches)",
            isError: false,
          };
        } catch (err) {
          return memoryFailure("memory_search", err);
        }
      },
    },
    {
      name: "memory_save",
      description:
        "Save a durable fact about this user or their work to long-term memory (one fact per call). Set evergreen for facts that do not go stale.",
      parameters: {
        type: "object",
        properties: {
          text: { type: "string" },
          evergreen: { type: "boolean" },
          kind: { type: "string", enum: ["fact", "episode", "profile", "note"] },
        },
        required: ["text"],
        additionalProperties: false,
      },
      async execute(args, ctx) {
        if (typeof args.text !== "string" || args.text.trim() === "")
          return { output: "memory_save: `text` must be a non-empty string", isError: true };
        const kinds: Record<string, MemoryKind> = {
          fact: MemoryKind.FACT,
          episode: MemoryKind.EPISODE,
          profile: MemoryKind.PROFILE,
          note: MemoryKind.NOTE,
        };
        try {
          const res = await memory.addMemories(
            {
              scope: { ...scope, agentId },
              memories: [
                {
                  text: args.text,
                  evergreen: args.evergreen === true,
                  kind: kinds[String(args.kind)] ?? MemoryKind.FACT,
                  sessionId: ctx.sessionId,
                  provenance: `agent:${agentId}`,
                },
              ],
            },
            opts(ctx),
          );
          onSaved();
          const r = res.results[0];
          return {
            output: r?.outcome === AddOutcome.DUPLICATE ? `already remembered as ${r.id}` : `saved as ${res.ids[0]}`,
            isError: false,
          };
        } catch (err) {
          return memoryFailure("memory_save", err);
        }
      },
    },
    {
      name: "memory_forget",
      description: "Delete a memory by its id (as memory_search shows it).",
      parameters: {
        type: "object",
        properties: { id: { type: "string" } },
        required: ["id"],
        additionalProperties: false,
      },
      async execute(args, ctx) {
        if (typeof args.id !== "string" || args.id === "")
          return { output: "memory_forget: `id` must be a memory id", isError: true };
        try {
          const { forgotten } = await memory.forgetMemories({ scope, ids: [args.id] }, opts(ctx));
          return forgotten > 0
            ? { output: `forgot ${args.id}`, isError: false }
            : { output: `no memory ${args.id} here`, isError: true };
        } catch (err) {
          return memoryFailure("memory_forget", err);
        }
      },
    },
  ];
}
