// `process`: background commands in the session's sandbox (background.ts): start one, list them,
// read what they wrote since the last read, write to their stdin, signal them, wait for them.
// Running ones count against the owner's processesPerSession quota.
import { Signal } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient } from "../../shared/rpc.js";
import { identityMetadata, type Identity } from "../../shared/auth/auth.js";
import type { SessionRef } from "../../shared/session-ref.js";
import type { BackgroundProcesses } from "./background.js";
import { MAX_RESULT_CHARS, type EgressOf, type Tool, type ToolResult } from "./tools.js";

const SIGNALS: Record<string, Signal> = {
  HUP: Signal.HANGUP,
  INT: Signal.INTERRUPT,
  QUIT: Signal.QUIT,
  KILL: Signal.KILL,
  TERM: Signal.TERMINATE,
};
/** Longest a `wait` blocks the turn. */
const MAX_WAIT_MS = 120_000;

const wrong = (text: string): ToolResult => ({ output: `process: ${text}`, isError: true });

export function processTool(
  ref: SessionRef,
  owner: Identity,
  sandbox: ServiceClient<(typeof SandboxService)["method"]>,
  procs: BackgroundProcesses,
  limits: { max: () => number; egress: EgressOf },
): Tool {
  const metadata = identityMetadata(owner);
  return {
    name: "process",
    description:
      "Background commands in this session's sandbox: start one (it keeps running after this call), list them, read their new output, write to their stdin, send a signal (INT, TERM, KILL, HUP, QUIT), or wait for one to end.",
    parameters: {
      type: "object",
      properties: {
        action: { type: "string", enum: ["start", "list", "read", "write", "signal", "wait"] },
        id: { type: "string", description: "The process (p1, p2, ...), for read, write, signal and wait." },
        command: { type: "string", description: "start: the shell command." },
        data: { type: "string", description: "write: text for its stdin." },
        close: { type: "boolean", description: "write: close its stdin after data." },
        signal: { type: "string", enum: Object.keys(SIGNALS) },
        timeout_ms: { type: "integer", minimum: 1, maximum: MAX_WAIT_MS, description: "wait: how long at most." },
      },
      required: ["action"],
      additionalProperties: false,
    },
    async execute(args, ctx) {
      const failed = (err: unknown) =>
        wrong(`the sandbox said: ${(err as { details?: string }).details ?? (err as Error).message}`);
      if (args.action === "list") {
        const all = procs.list(ref);
        return {
          output: all.length ? all.map((p) => p.describe()).join("\n") : "(no background processes)",
          isError: false,
        };
      }
      if (args.action === "start") {
        if (typeof args.command !== "string" || args.command.trim() === "") return wrong("start needs a `command`");
        const running = procs.list(ref).filter((p) => p.running).length;
        if (running >= limits.max())
          return wrong(`this session already runs ${running} background processes (quota processesPerSession)`);
        try {
          const p = await procs.start(ref, ctx.agentId, owner, args.command, await limits.egress());
          return { output: `started ${p.id}`, isError: false };
        } catch (err) {
          return failed(err);
        }
      }
      const id = typeof args.id === "string" ? args.id : "";
      const p = procs.get(ref, id);
      if (!p) return wrong(id ? `no process ${id} in this session` : "`id` is required");
      const target = { sessionId: ref.sessionId, agentId: ctx.agentId, execId: p.execId };
      try {
        switch (args.action) {
          case "read":
            return { output: `${p.describe()}\n${p.read(MAX_RESULT_CHARS - 200)}`, isError: false };
          case "write":
            if (!p.running) return wrong(`${id} has ended`);
            if (typeof args.data !== "string" && args.close !== true) return wrong("write needs `data` or `close`");
            await sandbox.writeStdin(
              {
                ...target,
                data: Buffer.from(typeof args.data === "string" ? args.data : ""),
                close: args.close === true,
              },
              { metadata, timeoutMs: 10_000 },
            );
            return {
              output: `wrote ${Buffer.byteLength(String(args.data ?? ""))} bytes to ${id}${args.close ? " and closed its stdin" : ""}`,
              isError: false,
            };
          case "signal": {
            const signal = SIGNALS[String(args.signal)];
            if (signal === undefined) return wrong(`signal must be one of ${Object.keys(SIGNALS).join(", ")}`);
            if (!p.running) return wrong(`${id} has ended`);
            await sandbox.signalExec({ ...target, signal }, { metadata, timeoutMs: 10_000 });
            // A signal that ends it is reported by the exit that follows within moments.
            await p.waitEnd(1000, ctx.signal);
            return { output: `sent ${args.signal} to ${id}\n${p.describe()}`, isError: false };
          }
          case "wait": {
            const ms =
              typeof args.timeout_ms === "number" ? Math.min(MAX_WAIT_MS, Math.max(1, args.timeout_ms)) : 30_000;
            const ended = await p.waitEnd(ms, ctx.signal);
            const head = ended ? p.describe() : `${p.describe()}\n[still running after ${ms} ms]`;
            return { output: `${head}\n${p.read(MAX_RESULT_CHARS - 300)}`, isError: false };
          }
          default:
            return wrong("`action` must be start, list, read, write, signal or wait");
        }
      } catch (err) {
        return failed(err);
      }
    },
  };
}
