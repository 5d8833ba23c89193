// The service's side of the in-sandbox agent (sandbox/agent/troupe-agent.c): one connection per
// container, over the container's attached stdin and stdout, carrying framed requests and replies.
// A command costs a frame each way instead of a Docker API exec.
//
// The frames are agent-frames.ts's. agent-unframer.ts cuts the container's output into them (after
// Docker's own 8-byte headers); the agent's stderr is diagnostics only.
//
// The other end is inside a sandbox, so this side trusts nothing it reads: every length is
// checked against a cap and against what is there before anything is read, output beyond the
// credit window or the command's output cap is refused, and a frame for a request or command
// this side does not know is refused too. Any such violation ends this one connection (the
// caller discards the container and its callers get AgentGone), never the process.
import type { Duplex } from "node:stream";
import type { Container } from "./engine.js";
import { AgentSockets, type AgentSocket, type NetRep } from "./agent-socket.js";
import type { EgressState } from "./egress-proxy.js";
import { AgentDiagnostics } from "./agent-diagnostics.js";
import { AgentUnframer, ProtocolViolation, violation } from "./agent-unframer.js";
import { AGENT_VERSION, Rep, Req, frame, u32 } from "./agent-frames.js";

const HELLO_TIMEOUT_MS = 5000;

/** A failed request, with the errno the agent met (ENOENT, EXDEV for a link leading out, ...). */
export class AgentError extends Error {
  constructor(
    readonly errno: number,
    message: string,
  ) {
    super(message);
  }
}

/** The connection ended (the container stopped, the engine dropped the attach, or the agent broke the protocol). */
export class AgentGone extends Error {}

export interface AgentExit {
  /** 128 + the signal's number when a signal ended it. */
  exitCode: number;
  signal: number;
  timedOut: boolean;
  truncated: boolean;
}

export interface ExecHandlers {
  output(stream: "stdout" | "stderr", data: Buffer): void;
  exit(exit: AgentExit): void;
  /** The connection ended before the command did. */
  lost(err: Error): void;
}

export interface ExecOptions {
  timeoutMs: number;
  maxOutputBytes: number;
  /** Output the agent may send before the service acknowledges it (credit()). */
  windowBytes: number;
  stdin?: Uint8Array;
  /** Keep stdin open after `stdin` for writeStdin(), until closeStdin(). */
  openStdin?: boolean;
  /** Give the command the proxy variables naming the egress port (egress-proxy.ts). */
  proxy?: boolean;
}

export interface RunningExec {
  readonly id: number;
  /** The service passed this much output on: the agent may send as much again. */
  credit(bytes: number): void;
  signal(signo: number): Promise<void>;
  /** More stdin, for a command started with openStdin (the agent queues what the pipe cannot take). */
  writeStdin(data: Uint8Array): void;
  closeStdin(): void;
}

export interface FileEntryInfo {
  name: string;
  type: "file" | "directory" | "symlink" | "other";
  size: number;
  mtimeMs: number;
}

interface Pending {
  resolve(frame: { type: number; payload: Buffer }): void;
  reject(err: Error): void;
}

/** A running command as this side accounts for it. */
interface ExecState {
  /** The command line, for saying which commands a lost sandbox was running. */
  command: string;
  handlers: ExecHandlers;
  window: number;
  maxOutput: number;
  /** Output bytes received, and credited back to the agent. */
  received: number;
  credited: number;
}

export interface AttachOptions {
  /** The agent's stderr, a line at a time, escaped and rate-limited. */
  diagnostics(line: string): void;
  /** The agent broke the protocol: the connection has ended; discard the container. */
  broken?(reason: string): void;
  /** A command connected to the egress port; without this, such connections are closed. */
  connection?(socket: AgentSocket, agent: AgentConnection): void;
  /** The connection ended without close(): the container stopped, or the engine dropped it. */
  lost?(reason: string, runningCommands: number): void;
}

/** Rejects with `onTimeout()`'s error when `work` has not settled in time. */
export async function within<T>(work: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      work,
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(onTimeout()), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

export class AgentConnection {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly execs = new Map<number, ExecState>();
  /** The agent's stderr, escaped and rate-limited on its way to options.diagnostics. */
  private readonly diagnostics: AgentDiagnostics;
  /** The agent's bytes, cut into frames (agent-unframer.ts). */
  private readonly unframer = new AgentUnframer({
    stderr: (text) => this.diagnostics.report(text),
    frame: (type, id, payload) => this.dispatch(type, id, payload),
    stopped: () => this.ended !== undefined,
  });
  private ended: Error | undefined;
  /** close() was called: the end that follows is ours. */
  private closing = false;
  /** What the agent last said it was claimed for (empty: a pooled sandbox). */
  claimedFor = "";
  /** Commands' connections to the egress port. */
  private readonly sockets: AgentSockets;
  /** What those connections may reach, and what they have used (set by the service, egress-proxy.ts). */
  egress: EgressState = { hosts: [], budgetBytes: 0, usedBytes: 0 };

  private constructor(
    private readonly stream: Duplex,
    private readonly options: AttachOptions,
  ) {
    const connection = options.connection;
    this.diagnostics = new AgentDiagnostics((line) => options.diagnostics(line));
    this.sockets = new AgentSockets(
      (type, id, ...parts) => {
        if (!this.ended) this.stream.write(frame(type, id, ...parts));
      },
      connection && ((socket) => connection(socket, this)),
    );
    stream.on("data", (chunk: Buffer) => this.receive(chunk));
    const end = () => this.end(new AgentGone("the sandbox's agent connection ended"));
    stream.on("end", end);
    stream.on("close", end);
    stream.on("error", (err: Error) =>
      this.end(new AgentGone(`the sandbox's agent connection failed: ${err.message}`)),
    );
  }

  /**
   * Attaches to the container's stdio (before start(), for a new container, so nothing is
   * missed) and returns the connection; call hello() once the container runs.
   */
  static async attach(container: Container, options: AttachOptions): Promise<AgentConnection> {
    return new AgentConnection(await container.attach(), options);
  }

  /** A connection over any duplex stream that carries Docker's framing (tests drive it with their own). */
  static over(stream: Duplex, options: AttachOptions): AgentConnection {
    return new AgentConnection(stream, options);
  }

  get alive(): boolean {
    return !this.ended;
  }

  get runningCommands(): number {
    return this.execs.size;
  }

  /** The command lines running now, oldest first. */
  get runningCommandLines(): string[] {
    return [...this.execs.values()].map((e) => e.command);
  }

  /**
   * Greets the agent and checks its version; ends commands an earlier connection left behind.
   * Sets claimedFor from its answer.
   */
  async hello(): Promise<void> {
    this.unframer.resync();
    const reply = await within(
      this.request(Req.Hello, this.nextId++),
      HELLO_TIMEOUT_MS,
      () =>
        new AgentGone(
          `the sandbox's agent did not answer within ${HELLO_TIMEOUT_MS} ms (an image without troupe-agent?)`,
        ),
    );
    const [version, claim = ""] = reply.payload.toString("utf8").split("\n");
    if (version !== AGENT_VERSION)
      throw new AgentGone(
        `the sandbox image's agent is ${version}, this service speaks ${AGENT_VERSION}: rebuild it with \`make sandbox-image\``,
      );
    this.claimedFor = claim;
  }

  async claim(key: string): Promise<void> {
    await this.request(Req.Claim, this.nextId++, Buffer.from(key, "utf8"));
    this.claimedFor = key;
  }

  exec(command: string, opts: ExecOptions, handlers: ExecHandlers): RunningExec {
    if (this.ended) throw this.ended;
    const id = this.nextId++;
    this.execs.set(id, {
      command,
      handlers,
      window: opts.windowBytes,
      maxOutput: opts.maxOutputBytes,
      received: 0,
      credited: 0,
    });
    const head = Buffer.alloc(13);
    head.writeUInt32BE(opts.timeoutMs, 0);
    head.writeUInt32BE(opts.maxOutputBytes, 4);
    head.writeUInt32BE(opts.windowBytes, 8);
    head.writeUInt8((opts.stdin?.length || opts.openStdin ? 1 : 0) | (opts.proxy ? 2 : 0), 12);
    this.stream.write(frame(Req.Exec, id, head, Buffer.from(command, "utf8")));
    const writeStdin = (data: Uint8Array) => {
      // In pieces well under the agent's frame limit; the agent buffers what the pipe cannot take.
      for (let off = 0; off < data.length && !this.ended; off += 1 << 20)
        this.stream.write(frame(Req.Stdin, id, data.subarray(off, off + (1 << 20))));
    };
    if (opts.stdin?.length) writeStdin(opts.stdin);
    if (opts.stdin?.length && !opts.openStdin) this.stream.write(frame(Req.StdinClose, id));
    return {
      writeStdin,
      closeStdin: () => {
        if (!this.ended) this.stream.write(frame(Req.StdinClose, id));
      },
      id,
      credit: (bytes) => {
        const state = this.execs.get(id);
        if (this.ended || !state) return;
        state.credited += bytes;
        this.stream.write(frame(Req.Credit, id, u32(bytes)));
      },
      signal: async (signo) => {
        await this.request(Req.Signal, id, Buffer.from([signo]));
      },
    };
  }

  /** Kills every process of the sandbox but the agent; resolves once they are dead. */
  async killAll(): Promise<void> {
    await this.request(Req.KillAll, this.nextId++);
  }

  async readFile(path: string, maxBytes: number): Promise<{ data: Buffer; size: number; truncated: boolean }> {
    const { payload } = await this.request(Req.Read, this.nextId++, u32(maxBytes), Buffer.from(path, "utf8"));
    // Checked when it arrived (dispatch): at least its 9-byte header.
    return { size: Number(payload.readBigUInt64BE(0)), truncated: payload[8] === 1, data: payload.subarray(9) };
  }

  async writeFile(path: string, data: Uint8Array, opts: { mode: number; createParents: boolean }): Promise<void> {
    const p = Buffer.from(path, "utf8");
    const head = Buffer.alloc(7);
    head.writeUInt8(opts.createParents ? 1 : 0, 0);
    head.writeUInt32BE(opts.mode, 1);
    head.writeUInt16BE(p.length, 5);
    await this.request(Req.Write, this.nextId++, head, p, data);
  }

  async list(path: string, maxEntries: number): Promise<{ entries: FileEntryInfo[]; truncated: boolean }> {
    const { payload } = await this.request(Req.List, this.nextId++, u32(maxEntries), Buffer.from(path, "utf8"));
    const types = ["other", "file", "directory", "symlink", "other"] as const;
    const entries: FileEntryInfo[] = [];
    for (let off = 1; off + 19 <= payload.length; ) {
      const nameLen = payload.readUInt16BE(off + 17);
      if (off + 19 + nameLen > payload.length)
        throw new AgentError(5, "the sandbox's agent sent a listing that does not add up");
      entries.push({
        type: types[payload[off]] ?? "other",
        size: Number(payload.readBigUInt64BE(off + 1)),
        mtimeMs: Number(payload.readBigInt64BE(off + 9)),
        name: payload.subarray(off + 19, off + 19 + nameLen).toString("utf8"),
      });
      off += 19 + nameLen;
    }
    return { entries, truncated: payload[0] === 1 };
  }

  /** Drops the attachment; the agent and its commands go on until the next connection greets it. */
  close(): void {
    this.closing = true;
    this.end(new AgentGone("the sandbox's agent connection was closed"));
    this.stream.destroy();
  }

  private request(type: Req, id: number, ...parts: Uint8Array[]): Promise<{ type: number; payload: Buffer }> {
    if (this.ended) return Promise.reject(this.ended);
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.stream.write(frame(type, id, ...parts));
    });
  }

  /** Everything the agent sends comes through here; nothing it sends may throw past it. */
  private receive(chunk: Buffer) {
    if (this.ended) return;
    try {
      this.unframer.push(chunk);
    } catch (err) {
      const reason = err instanceof ProtocolViolation ? err.message : `unreadable output (${(err as Error).message})`;
      this.end(new AgentGone(`the sandbox's agent broke the protocol: ${reason}`));
      this.stream.destroy();
      this.options.broken?.(reason);
    }
  }

  private dispatch(type: number, id: number, payload: Buffer) {
    if (AgentSockets.isNetReply(type)) {
      const wrong = this.sockets.dispatch(type as NetRep, id, payload);
      if (wrong) violation(wrong);
      return;
    }
    if (type === Rep.Out || type === Rep.Exit) {
      const exec = this.execs.get(id);
      if (!exec) violation(`${type === Rep.Out ? "output" : "an exit"} for command ${id}, which is not running`);
      if (type === Rep.Out) {
        if (payload.length < 1 || (payload[0] !== 1 && payload[0] !== 2)) violation("output without its stream");
        const bytes = payload.length - 1;
        exec.received += bytes;
        if (exec.received > exec.maxOutput)
          violation(`command ${id} sent ${exec.received} bytes, over its cap of ${exec.maxOutput}`);
        if (exec.received - exec.credited > exec.window) violation(`command ${id} sent past its credit window`);
        exec.handlers.output(payload[0] === 2 ? "stderr" : "stdout", payload.subarray(1));
        return;
      }
      if (payload.length !== 9) violation(`an exit of ${payload.length} bytes`);
      this.execs.delete(id);
      const flags = payload[8];
      exec.handlers.exit({
        exitCode: payload.readInt32BE(0),
        signal: payload.readInt32BE(4),
        timedOut: (flags & 1) !== 0,
        truncated: (flags & 2) !== 0,
      });
      return;
    }
    if (type === Rep.Err && payload.length < 4) violation("an error without its code");
    const exec = this.execs.get(id);
    const waiting = this.pending.get(id);
    if (type === Rep.Err && !waiting && exec) {
      // The command could not start (fork failed, too many running).
      this.execs.delete(id);
      exec.handlers.lost(new AgentError(payload.readInt32BE(0), payload.subarray(4).toString("utf8")));
      return;
    }
    if (!waiting) violation(`a reply (type ${type}) to request ${id}, which was not asked`);
    if (type === Rep.File && payload.length < 9) violation("a file reply without its header");
    if (type === Rep.Listing && payload.length < 1) violation("a listing without its header");
    if (![Rep.Hello, Rep.Ok, Rep.Err, Rep.File, Rep.Listing].includes(type)) violation(`a reply of type ${type}`);
    this.pending.delete(id);
    if (type === Rep.Err) waiting.reject(new AgentError(payload.readInt32BE(0), payload.subarray(4).toString("utf8")));
    else waiting.resolve({ type, payload });
  }

  private end(err: Error) {
    if (this.ended) return;
    this.ended = err;
    if (!this.closing) this.options.lost?.(err.message, this.execs.size);
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const e of this.execs.values()) e.handlers.lost(err);
    this.execs.clear();
    this.sockets.endAll();
  }
}
