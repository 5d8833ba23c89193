// What the sandbox service accepts and answers: request limits and their checks, the workspace
// path a request may name, and the statuses an agent's failures become. server.ts and
// exec-stream.ts apply them.
import { type ExecRequest, Signal } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { RpcError, Status, invalidArgumentIf, unavailable } from "../shared/errors.js";
import { AgentError, AgentGone } from "./agent-connection.js";

export const DEFAULT_OUTPUT_BYTES = 1024 * 1024;
const MAX_OUTPUT_BYTES = 16 * 1024 * 1024;
const MAX_TIMEOUT_MS = 30 * 60_000;
const MAX_COMMAND_CHARS = 64 * 1024;
export const MAX_STDIN_WRITE = 1024 * 1024;
export const DEFAULT_READ_BYTES = 1024 * 1024;
export const DEFAULT_LIST_ENTRIES = 1000;
export const MAX_LIST_ENTRIES = 10_000;
const MAX_PATH_BYTES = 4096;
const MAX_EGRESS_HOSTS = 100;
export const DEFAULT_EGRESS_BUDGET = 1 << 30;
/** A host name, a *.suffix pattern, or an IPv4 or IPv6 address (as URLs spell it, bracketed). */
const EGRESS_HOST = /^(\*\.)?[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$|^\[[0-9a-f:.]{2,45}\]$/;

export const SIGNALS: Partial<Record<Signal, number>> = {
  [Signal.HANGUP]: 1,
  [Signal.INTERRUPT]: 2,
  [Signal.QUIT]: 3,
  [Signal.KILL]: 9,
  [Signal.TERMINATE]: 15,
};

// Linux errno values the agent reports, as statuses a caller can act on.
const ERRNO_STATUS: Record<number, [Status, string]> = {
  1: [Status.PERMISSION_DENIED, "not permitted"],
  2: [Status.NOT_FOUND, "no such file or directory"],
  // The agent's own cap on commands, or the container's pids limit held by running commands.
  11: [Status.RESOURCE_EXHAUSTED, "too many commands or processes running in this sandbox"],
  13: [Status.PERMISSION_DENIED, "permission denied"],
  17: [Status.ALREADY_EXISTS, "already exists"],
  18: [Status.PERMISSION_DENIED, "a symbolic link leads out of the workspace"],
  20: [Status.FAILED_PRECONDITION, "a part of the path is not a directory"],
  21: [Status.FAILED_PRECONDITION, "is a directory"],
  22: [Status.FAILED_PRECONDITION, "not a regular file"],
  28: [Status.RESOURCE_EXHAUSTED, "the workspace is full"],
  36: [Status.INVALID_ARGUMENT, "path too long"],
  40: [Status.PERMISSION_DENIED, "too many symbolic links, or a link where none was before"],
  122: [Status.RESOURCE_EXHAUSTED, "the workspace is full"],
};

/** What a caller should see for a failed agent request. */
export function agentStatus(err: unknown, what: string): Error {
  if (err instanceof AgentError) {
    const [code, text] = ERRNO_STATUS[err.errno] ?? [Status.INTERNAL, err.message];
    return new RpcError(code, `${what}: ${text}`);
  }
  if (err instanceof AgentGone)
    return unavailable(`${what}: the sandbox ended (${err.message}); it is made anew on the next call`);
  return err as Error;
}

/**
 * A request's path as the agent takes it: relative to the workspace, without `.` or empty parts.
 * `..` is refused outright rather than resolved, and so are NUL bytes and absolute paths outside
 * the workspace. Links are the agent's business (it follows them only inside the workspace).
 */
export function workspacePath(path: string, allowRoot: boolean): string {
  invalidArgumentIf(path.includes("\0"), "path must not contain a NUL byte");
  invalidArgumentIf(Buffer.byteLength(path) > MAX_PATH_BYTES, `path is over ${MAX_PATH_BYTES} bytes`);
  let rel = path;
  if (path.startsWith("/")) {
    if (path !== "/workspace" && !path.startsWith("/workspace/"))
      throw new RpcError(Status.PERMISSION_DENIED, "absolute paths must be under /workspace");
    rel = path.slice("/workspace".length);
  }
  const parts = rel.split("/").filter((p) => p !== "" && p !== ".");
  invalidArgumentIf(parts.includes(".."), "path must not contain `..`");
  invalidArgumentIf(
    parts.some((p) => Buffer.byteLength(p) > 255),
    "a path component is over 255 bytes",
  );
  invalidArgumentIf(!allowRoot && parts.length === 0, "path names the workspace itself, not a file in it");
  return parts.join("/");
}

/** Refuses an exec request outside the limits (INVALID_ARGUMENT, naming the field). */
export function validateExec(req: ExecRequest): void {
  invalidArgumentIf(req.command.trim() === "", "command must not be empty");
  invalidArgumentIf(req.command.length > MAX_COMMAND_CHARS, `command is over ${MAX_COMMAND_CHARS} characters`);
  invalidArgumentIf(req.command.includes("\0"), "command must not contain a NUL byte");
  invalidArgumentIf(req.timeoutMs > MAX_TIMEOUT_MS, `timeout_ms must be at most ${MAX_TIMEOUT_MS}`);
  invalidArgumentIf(req.maxOutputBytes > MAX_OUTPUT_BYTES, `max_output_bytes must be at most ${MAX_OUTPUT_BYTES}`);
  const hosts = req.egress?.allowHosts ?? [];
  invalidArgumentIf(hosts.length > MAX_EGRESS_HOSTS, `egress.allow_hosts takes at most ${MAX_EGRESS_HOSTS} hosts`);
  for (const host of hosts)
    invalidArgumentIf(
      host.length > 253 || !EGRESS_HOST.test(host),
      `egress.allow_hosts: ${JSON.stringify(host.slice(0, 100))} is not a lower-case host name, *.name or address`,
    );
}
