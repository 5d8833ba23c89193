// An MCP stdio server inside the session's sandbox, spoken to through the sandbox service: the
// process is one Exec stream kept open (stdin open, WriteStdin for each message), newline-delimited
// JSON-RPC on its stdout, as the stdio transport of the MCP specification says. Nothing of the
// server runs on the runner's host. The sandbox bounds the process as every command (its longest
// exec time and output cap): the transport closes itself before the cap and the connection starts
// the server again, so a long session is never left with a server whose output is dropped.
import { ReadBuffer, serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import type { SandboxService } from "../../../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient } from "../../../shared/rpc.js";
import { identityMetadata, type Identity } from "../../../shared/auth/auth.js";

type SandboxClient = ServiceClient<(typeof SandboxService)["method"]>;

/** The sandbox's longest exec, and its largest output cap (sandbox/requests.ts). */
const LIFETIME_MS = 30 * 60_000;
const OUTPUT_CAP = 16 * 1024 * 1024;
/** Output after which the server is restarted, below the cap so no message is cut. */
const RESTART_AFTER = OUTPUT_CAP - 2 * 1024 * 1024;
/** Stderr kept for the error that says why a server ended. */
const STDERR_KEPT = 2048;

export interface SandboxProcess {
  sandbox: SandboxClient;
  owner: Identity;
  sessionId: string;
  agentId: string;
  /** The whole command line, quoted for /bin/sh. */
  commandLine: string;
  /** The agent's way out, as every command of the sandbox gets it (each Exec's grant replaces the last). */
  egress?: { allowHosts: string[]; budgetBytes: bigint };
}

export class SandboxStdioTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;
  private readonly cancel = new AbortController();
  private readonly buffer = new ReadBuffer();
  private execId?: Promise<string>;
  private received = 0;
  private stderr = "";
  private closed = false;
  private readonly inbox: JSONRPCMessage[] = [];
  private delivering = false;
  private exit = "";
  private markEnded!: () => void;
  private readonly ended = new Promise<void>((resolve) => {
    this.markEnded = resolve;
  });

  constructor(private readonly proc: SandboxProcess) {}

  /** Stderr's last lines: why a server that ended did. */
  get lastStderr(): string {
    return this.stderr.trim();
  }

  start(): Promise<void> {
    const { sandbox, owner, sessionId, agentId, commandLine, egress } = this.proc;
    const call = sandbox.exec(
      {
        sessionId,
        agentId,
        command: commandLine,
        timeoutMs: LIFETIME_MS,
        openStdin: true,
        maxOutputBytes: OUTPUT_CAP,
        egress,
      },
      { signal: this.cancel.signal, metadata: identityMetadata(owner) },
    );
    this.execId = new Promise<string>((resolve, reject) => {
      void (async () => {
        try {
          for await (const msg of call) {
            const kind = msg.kind;
            if (kind.case === "started") resolve(kind.value.execId);
            else if (kind.case === "stdout") this.read(kind.value);
            else if (kind.case === "stderr") this.stderr = (this.stderr + Buffer.from(kind.value)).slice(-STDERR_KEPT);
            else if (kind.case === "exit" && !this.closed) {
              const e = kind.value;
              this.exit = `exit ${e.exitCode}${e.timedOut ? ", at the sandbox's time limit" : ""}`;
              this.onerror?.(new Error(`the server's process ended (${this.exit})`));
            }
          }
          reject(new Error("the sandbox ended the server before it started"));
        } catch (err) {
          if (!this.closed)
            this.onerror?.(
              new Error(`the sandbox: ${(err as { details?: string }).details ?? (err as Error).message}`),
            );
          reject(err);
        } finally {
          this.finish();
        }
      })();
    });
    // The server counts as started once the sandbox started it; a failure to start rejects here.
    return this.execId.then(() => undefined);
  }

  async send(message: JSONRPCMessage): Promise<void> {
    if (this.closed || !this.execId) throw new Error("the server's process is not running");
    const { sandbox, owner, sessionId, agentId } = this.proc;
    try {
      await sandbox.writeStdin(
        { sessionId, agentId, execId: await this.execId, data: Buffer.from(serializeMessage(message)) },
        { metadata: identityMetadata(owner), timeoutMs: 10_000 },
      );
    } catch (err) {
      // The process is gone (it ended at once, say): its end, and what it said, are the reason.
      await Promise.race([this.ended, new Promise((r) => setTimeout(r, 2000))]);
      if (this.exit) throw new Error(`the server's process ended (${this.exit})`);
      throw err;
    }
  }

  async close(): Promise<void> {
    this.cancel.abort();
    this.finish();
  }

  private read(chunk: Uint8Array): void {
    this.received += chunk.byteLength;
    try {
      this.buffer.append(Buffer.from(chunk));
    } catch (err) {
      // One message over the buffer's 10 MB: dropped whole (reading resumes at the next line).
      this.onerror?.(err as Error);
      return;
    }
    for (;;) {
      let message: JSONRPCMessage | null;
      try {
        message = this.buffer.readMessage();
      } catch (err) {
        // A line that is not JSON-RPC (a server printing to stdout): said, and skipped.
        this.onerror?.(err as Error);
        continue;
      }
      if (message === null) break;
      this.inbox.push(message);
    }
    this.deliver();
    if (this.received > RESTART_AFTER) {
      this.onerror?.(new Error("the server's output neared the sandbox's cap; it is started again"));
      void this.close();
    }
  }

  /**
   * Hands the messages read to the client one per turn of the event loop. Several lines often come
   * in one chunk (a progress notification and then the result); the SDK handles a notification a
   * microtask later but a response at once, so handed over together the result would end the call
   * before its last progress is seen.
   */
  private deliver(): void {
    if (this.delivering || this.inbox.length === 0) return;
    this.delivering = true;
    setImmediate(() => {
      this.delivering = false;
      const next = this.inbox.shift();
      if (next && !this.closed) this.onmessage?.(next);
      this.deliver();
    });
  }

  private finish(): void {
    if (this.closed) return;
    this.closed = true;
    this.markEnded();
    this.buffer.clear();
    this.onclose?.();
  }
}

/** `command` and `args` as one /bin/sh command line, each word single-quoted; `env` set before it. */
export function shellLine(command: string, args: readonly string[], env: Record<string, string>): string {
  const q = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
  const vars = Object.entries(env).map(([k, v]) => `${k}=${q(v)}`);
  return ["exec", ...(vars.length > 0 ? ["env", ...vars] : []), q(command), ...args.map(q)].join(" ");
}
