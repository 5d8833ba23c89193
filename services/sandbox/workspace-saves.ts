// Workspaces that outlive their containers. A sandbox's /workspace stays what it was, a tmpfs with
// the same mount options and size bound, under the same user, seccomp filter and limits on runc
// and runsc; what is added is a save: after a burst of work (SAVE_AFTER_MS without a command) the
// workspace is archived by `tar` run inside the sandbox, as the sandbox's own user, and the archive
// is kept in the service's data directory. When the key next gets a sandbox (after an idle reap,
// the maximum age, a crash of the container or of the engine) the archive is unpacked into it,
// again by `tar` inside the sandbox, and the first command is told so.
//
// The host never reads an archive's contents: it only stores bytes a sandbox wrote (bounded by
// the workspace's own size) and hands them back to a sandbox of the same key. A save is of one
// key only, under a name made of its key's hash. Release (DeleteSession, retention) removes it.
import { createHash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../shared/process/log.js";
import type { AgentConnection, AgentExit } from "./agent-connection.js";

/** A workspace is saved once this long has passed without a command in its sandbox. */
export const SAVE_AFTER_MS = 5_000;
const TAR_TIMEOUT_MS = 120_000;
const WINDOW_BYTES = 1 << 20;

export interface SaveInfo {
  savedAt: number;
  bytes: number;
  /** Commands that were running in the sandbox when it was saved (they do not come back). */
  running: number;
}

/** Runs `command` in the sandbox; its stdout goes to `sink`, stdin comes from `source`. */
function run(
  agent: AgentConnection,
  command: string,
  maxOutputBytes: number,
  sink?: (data: Buffer) => Promise<void>,
  source?: AsyncIterable<Buffer>,
): Promise<{ exit: AgentExit; stderr: string }> {
  return new Promise((resolve, reject) => {
    let stderr = "";
    let writing = Promise.resolve();
    const exec = agent.exec(
      command,
      { timeoutMs: TAR_TIMEOUT_MS, maxOutputBytes, windowBytes: WINDOW_BYTES, openStdin: source !== undefined },
      {
        output: (stream, data) => {
          if (stream === "stderr") stderr = (stderr + data.toString("utf8")).slice(-2000);
          else if (sink) writing = writing.then(() => sink(data)).then(() => exec.credit(data.length));
          if (stream === "stderr") exec.credit(data.length);
        },
        exit: (exit) => void writing.then(() => resolve({ exit, stderr }), reject),
        lost: reject,
      },
    );
    if (source)
      void (async () => {
        for await (const chunk of source) exec.writeStdin(chunk);
        exec.closeStdin();
      })().catch(reject);
  });
}

export class WorkspaceSaves {
  constructor(
    private readonly dir: string,
    /** A workspace's size bound: no save is larger (the archive's headers aside). */
    private readonly maxBytes: number,
    private readonly logger: Logger,
  ) {}

  private file(key: string): string {
    return path.join(this.dir, `${createHash("sha256").update(key).digest("hex").slice(0, 40)}.tar`);
  }

  /** When the key's workspace was last saved, and its size; undefined when it has no save. */
  async info(key: string): Promise<SaveInfo | undefined> {
    const meta = await readFile(`${this.file(key)}.json`, "utf8").catch(() => undefined);
    if (!meta) return undefined;
    const info = JSON.parse(meta) as SaveInfo & { key: string };
    return info.key === key ? { savedAt: info.savedAt, bytes: info.bytes, running: info.running ?? 0 } : undefined;
  }

  /** Archives the sandbox's workspace as the key's save (replacing the last one only once whole). */
  async save(key: string, agent: AgentConnection): Promise<SaveInfo> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    const target = this.file(key);
    const partial = `${target}.partial`;
    const out = createWriteStream(partial, { mode: 0o600 });
    let bytes = 0;
    // Counted before tar runs, which is a command too.
    const running = agent.runningCommands;
    const started = Date.now();
    try {
      // Headers and padding on top of the files: the cap is the workspace's size, twice.
      const { exit, stderr } = await run(
        agent,
        "tar -cf - .",
        Math.min(2 * this.maxBytes + (1 << 20), 0xffffffff),
        async (data) => {
          bytes += data.length;
          if (!out.write(data)) await new Promise<void>((r) => out.once("drain", () => r()));
        },
      );
      await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
      if (exit.exitCode !== 0 || exit.truncated || exit.timedOut)
        throw new Error(`tar ended with ${exit.exitCode}${exit.truncated ? " (too large)" : ""}: ${stderr.trim()}`);
      const info = { savedAt: Date.now(), bytes, running };
      this.logger.debug("saved a workspace", { scope: key, bytes, ms: info.savedAt - started });
      await rename(partial, target);
      await writeFile(`${target}.json`, JSON.stringify({ key, ...info }), { mode: 0o600 });
      return info;
    } catch (err) {
      out.destroy();
      await rm(partial, { force: true });
      throw err;
    }
  }

  /** Unpacks the key's save into a new sandbox's workspace; undefined when it has none. */
  async restore(key: string, agent: AgentConnection): Promise<SaveInfo | undefined> {
    const info = await this.info(key);
    if (!info) return undefined;
    const size = await stat(this.file(key))
      .then((s) => s.size)
      .catch(() => -1);
    if (size < 0) return undefined;
    const started = Date.now();
    const { exit, stderr } = await run(agent, "tar -xf -", 64 * 1024, undefined, createReadStream(this.file(key)));
    if (exit.exitCode !== 0) throw new Error(`tar -x ended with ${exit.exitCode}: ${stderr.trim()}`);
    this.logger.debug("restored a workspace", { scope: key, bytes: size, ms: Date.now() - started });
    return info;
  }

  /** Removes the key's save; whether it had one. */
  async remove(key: string): Promise<boolean> {
    const had = (await this.info(key)) !== undefined;
    await Promise.all([rm(this.file(key), { force: true }), rm(`${this.file(key)}.json`, { force: true })]);
    if (had) this.logger.info("removed a saved workspace", { scope: key });
    return had;
  }
}
