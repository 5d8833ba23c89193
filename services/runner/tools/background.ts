// Background processes (the `process` tool): commands started in a session's sandbox that outlive
// the tool call that started them. Each is one Exec stream the runner holds open with stdin kept
// open; its output collects here until the agent reads it. A process ends when its command does,
// at the sandbox's longest exec time (30 minutes), when the session's sandbox goes (deleted,
// reaped: the stream ends as killed), or when this runner stops (the stream is cancelled, and the
// sandbox kills the command with everything it started).
import { StringDecoder } from "node:string_decoder";
import type { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient } from "../../shared/rpc.js";
import { identityMetadata, type Identity } from "../../shared/auth/auth.js";
import { refKey, type SessionRef } from "../../shared/session-ref.js";
import type { EgressOf } from "./tools.js";

type SandboxClient = ServiceClient<(typeof SandboxService)["method"]>;

/** The longest a background process runs (the sandbox's longest exec). */
export const BACKGROUND_TIMEOUT_MS = 30 * 60_000;
/** Unread output kept per process; older unread output is dropped (and counted). */
const KEEP_CHARS = 256 * 1024;
/** Ended processes kept for reading, per session, and for how long. */
const KEEP_ENDED = 8;
const KEEP_ENDED_MS = 10 * 60_000;

export class BackgroundProcess {
  state: "starting" | "running" | "exited" | "killed" | "failed" = "starting";
  exitCode?: number;
  execId = "";
  endedMs?: number;
  private unread = "";
  private dropped = 0;
  private readonly decoders = { stdout: new StringDecoder("utf8"), stderr: new StringDecoder("utf8") };
  private readonly waiters = new Set<() => void>();
  readonly cancel = new AbortController();

  constructor(
    readonly id: string,
    readonly command: string,
    readonly startedMs = Date.now(),
  ) {}

  get running(): boolean {
    return this.state === "starting" || this.state === "running";
  }

  append(stream: "stdout" | "stderr", data: Uint8Array): void {
    this.unread += this.decoders[stream].write(Buffer.from(data));
    if (this.unread.length > KEEP_CHARS) {
      this.dropped += this.unread.length - KEEP_CHARS;
      this.unread = this.unread.slice(-KEEP_CHARS);
    }
    this.wake();
  }

  end(state: "exited" | "killed" | "failed", exitCode?: number, note = ""): void {
    if (!this.running) return;
    if (note) this.unread += note;
    this.state = state;
    this.exitCode = exitCode;
    this.endedMs = Date.now();
    this.wake();
  }

  /** Output since the last read (at most maxChars; the rest stays unread). */
  read(maxChars: number): string {
    const head = this.dropped > 0 ? `[${this.dropped} characters of output were dropped unread]\n` : "";
    this.dropped = 0;
    const out = this.unread.slice(0, maxChars);
    this.unread = this.unread.slice(out.length);
    const more = this.unread.length > 0 ? `\n[${this.unread.length} more characters unread]` : "";
    return head + out + more;
  }

  get unreadChars(): number {
    return this.unread.length;
  }

  /** Resolves when the process ends, or after ms, or on abort; true when it has ended. */
  async waitEnd(ms: number, signal: AbortSignal): Promise<boolean> {
    if (!this.running) return true;
    await new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        this.waiters.delete(check);
        resolve();
      };
      const check = () => !this.running && done();
      const timer = setTimeout(done, ms);
      signal.addEventListener("abort", done, { once: true });
      this.waiters.add(check);
    });
    return !this.running;
  }

  /** One line: id, state, age, command. */
  describe(now = Date.now()): string {
    const secs = Math.round(((this.endedMs ?? now) - this.startedMs) / 1000);
    const state =
      this.state === "exited"
        ? `exited ${this.exitCode}`
        : this.state === "killed"
          ? `killed (exit ${this.exitCode ?? 137})`
          : this.state;
    return `${this.id}: ${state} after ${secs} s; ${this.unread.length} characters unread; ${JSON.stringify(this.command.slice(0, 120))}`;
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }
}

/** Every session's background processes in this runner. */
export class BackgroundProcesses {
  private readonly bySession = new Map<string, Map<string, BackgroundProcess>>();
  /** Ids count per session (p1, p2, ...): one session learns nothing of another's from them. */
  private readonly counters = new Map<string, number>();
  private readonly sweep: NodeJS.Timeout;

  constructor(private readonly sandbox: SandboxClient) {
    // Output nobody read stays only so long: a runner of many sessions must not keep it all.
    this.sweep = setInterval(() => this.prune(Date.now()), 60_000);
    this.sweep.unref();
  }

  /** Forgets processes that ended over KEEP_ENDED_MS ago, and sessions left with none. */
  prune(now: number): void {
    for (const [key, procs] of this.bySession) {
      for (const [id, p] of procs) if (!p.running && now - (p.endedMs ?? now) > KEEP_ENDED_MS) procs.delete(id);
      if (procs.size === 0) {
        this.bySession.delete(key);
        this.counters.delete(key);
      }
    }
  }

  list(ref: SessionRef): BackgroundProcess[] {
    return [...(this.bySession.get(refKey(ref))?.values() ?? [])];
  }

  get(ref: SessionRef, id: string): BackgroundProcess | undefined {
    return this.bySession.get(refKey(ref))?.get(id);
  }

  /** Starts `command` in the session's sandbox; resolves once the sandbox has started it. */
  async start(
    ref: SessionRef,
    agentId: string,
    owner: Identity,
    command: string,
    egress?: Awaited<ReturnType<EgressOf>>,
  ): Promise<BackgroundProcess> {
    const key = refKey(ref);
    const mine = this.bySession.get(key) ?? new Map<string, BackgroundProcess>();
    this.bySession.set(key, mine);
    const ended = [...mine.values()].filter((p) => !p.running);
    for (const old of ended.slice(0, Math.max(0, ended.length - KEEP_ENDED + 1))) mine.delete(old.id);
    const n = (this.counters.get(key) ?? 0) + 1;
    this.counters.set(key, n);
    const proc = new BackgroundProcess(`p${n}`, command);
    mine.set(proc.id, proc);
    const call = this.sandbox.exec(
      { sessionId: ref.sessionId, agentId, command, timeoutMs: BACKGROUND_TIMEOUT_MS, openStdin: true, egress },
      { signal: proc.cancel.signal, metadata: identityMetadata(owner) },
    );
    const started = new Promise<void>((resolve, reject) => {
      void (async () => {
        try {
          for await (const msg of call) {
            const kind = msg.kind;
            if (kind.case === "started") {
              proc.execId = kind.value.execId;
              proc.state = "running";
              resolve();
            } else if (kind.case === "stdout" || kind.case === "stderr") proc.append(kind.case, kind.value);
            else if (kind.case === "exit") {
              const e = kind.value;
              const note = e.timedOut ? `\n[stopped at the ${BACKGROUND_TIMEOUT_MS / 60_000}-minute limit]` : "";
              proc.end(e.exitCode >= 128 ? "killed" : "exited", e.exitCode, note);
            }
          }
          proc.end("killed", 137, "\n[the sandbox ended without an exit status]");
        } catch (err) {
          const why = (err as { details?: string }).details ?? (err as Error).message;
          proc.end(proc.cancel.signal.aborted ? "killed" : "failed", undefined, `\n[${why}]`);
          reject(err);
        }
        resolve();
      })();
    });
    try {
      await started;
    } catch (err) {
      mine.delete(proc.id);
      throw err;
    }
    return proc;
  }

  /** Cancels every process of every session (the runner is stopping). */
  stopAll(): void {
    clearInterval(this.sweep);
    for (const procs of this.bySession.values()) for (const p of procs.values()) p.cancel.abort();
    this.bySession.clear();
    this.counters.clear();
  }
}
