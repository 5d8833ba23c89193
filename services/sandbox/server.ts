// The sandbox service, first version: one hardened container per session, created on first use,
// and Exec of shell commands inside it with streamed output, a timeout, an output cap, and a kill
// that reaches every process the command started.
//
// Two users live in each container. The keeper (PID 1's child, the process that holds the
// container open) runs as 65533; every command runs as 65534. Killing "all processes of 65534"
// (kill -9 -1, run as 65534) therefore ends a command's whole process tree, however it forked or
// detached, and neither touches the keeper nor lets untrusted code touch it.
import { createHash } from "node:crypto";
import { once } from "node:events";
import Docker from "dockerode";
import type { Config } from "../shared/config.js";
import { RpcError, Status, failedPrecondition, invalidArgumentIf, unavailable } from "../shared/errors.js";
import { ExecResponseSchema, SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { isSessionId } from "../shared/ids.js";
import type { Logger } from "../shared/log.js";
import { RpcServer, ServingStatus, write } from "../shared/rpc.js";
import type { RunningService } from "../shared/service.js";
import { create } from "@bufbuild/protobuf";

const KEEPER_USER = "65533:65533";
const TOOL_USER = "65534:65534";
const WORKSPACE = "/workspace";
const MAX_OUTPUT_BYTES = 1024 * 1024;
const MAX_TIMEOUT_MS = 30 * 60_000;
const MAX_COMMAND_CHARS = 64 * 1024;
const KILL_TIMEOUT_MS = 3000;

export interface SandboxLimits {
  memoryBytes: number;
  nanoCpus: number;
  pids: number;
  tmpBytes: number;
  workspaceBytes: number;
}

export const DEFAULT_LIMITS: SandboxLimits = {
  memoryBytes: 512 * 1024 * 1024,
  nanoCpus: 1_000_000_000,
  pids: 256,
  tmpBytes: 64 * 1024 * 1024,
  workspaceBytes: 256 * 1024 * 1024,
};

/** The container settings every sandbox gets; their hash is a label, so drift is visible. */
/**
 * An instance is one Troupe deployment's sandboxes (by default, one data directory). It is part of
 * every container's name and labels, so two deployments on one host never share a container.
 */
export const instanceOf = (dataDir: string): string => createHash("sha256").update(dataDir).digest("hex").slice(0, 12);

export function containerSpec(image: string, runtime: string, instance: string, sessionId: string, limits: SandboxLimits): Docker.ContainerCreateOptions {
  const hostConfig: Docker.HostConfig = {
    NetworkMode: "none",
    CapDrop: ["ALL"],
    SecurityOpt: ["no-new-privileges"],
    ReadonlyRootfs: true,
    Init: true,
    PidsLimit: limits.pids,
    Memory: limits.memoryBytes,
    MemorySwap: limits.memoryBytes,
    NanoCpus: limits.nanoCpus,
    Ulimits: [
      { Name: "nofile", Soft: 1024, Hard: 1024 },
      { Name: "core", Soft: 0, Hard: 0 },
    ],
    Tmpfs: {
      "/tmp": `rw,nosuid,nodev,noexec,size=${limits.tmpBytes},uid=65534,gid=65534,mode=1777`,
      [WORKSPACE]: `rw,nosuid,nodev,size=${limits.workspaceBytes},uid=65534,gid=65534,mode=0700`,
    },
    Runtime: runtime,
  };
  const configHash = createHash("sha256").update(JSON.stringify({ image, hostConfig })).digest("hex").slice(0, 16);
  return {
    Image: image,
    name: containerName(instance, sessionId),
    User: KEEPER_USER,
    Cmd: ["sleep", "2147483647"],
    WorkingDir: WORKSPACE,
    // Nothing from the service's own environment reaches the container.
    Env: ["PATH=/bin:/usr/bin", `HOME=${WORKSPACE}`],
    NetworkDisabled: true,
    Labels: {
      "troupe.owner": "troupe-sandbox",
      "troupe.instance": instance,
      "troupe.session": sessionId,
      "troupe.created": String(Date.now()),
      "troupe.config": configHash,
    },
    HostConfig: hostConfig,
  };
}

export const containerName = (instance: string, sessionId: string): string =>
  `troupe-sbx-${instance}-${createHash("sha256").update(sessionId).digest("hex").slice(0, 20)}`;

/** Splits Docker's multiplexed exec stream (8-byte header: stream type, 3 zero bytes, length). */
async function* demux(stream: AsyncIterable<Buffer>): AsyncIterable<{ stream: "stdout" | "stderr"; data: Buffer }> {
  let buf: Buffer = Buffer.alloc(0);
  for await (const chunk of stream) {
    buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
    while (buf.length >= 8) {
      const size = buf.readUInt32BE(4);
      if (buf.length < 8 + size) break;
      yield { stream: buf[0] === 2 ? "stderr" : "stdout", data: buf.subarray(8, 8 + size) as Buffer };
      buf = buf.subarray(8 + size);
    }
  }
}

/**
 * Runs a short command as the tool user with its output discarded, and resolves once it has
 * ended (with its exec, to inspect if the caller cares); rejects if it cannot start or has not
 * ended within KILL_TIMEOUT_MS.
 */
async function runBriefly(container: Docker.Container, cmd: string[]): Promise<Docker.Exec> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${cmd.join(" ")} did not finish in time`)), KILL_TIMEOUT_MS)));
  const run = async () => {
    const exec = await container.exec({ Cmd: cmd, User: TOOL_USER, AttachStdout: true, AttachStderr: true });
    const stream = (await exec.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
    stream.resume();
    await once(stream, "end");
    return exec;
  };
  try {
    return await Promise.race([run(), deadline]);
  } finally {
    clearTimeout(timer);
  }
}

export async function startSandbox(cfg: Config, logger: Logger): Promise<RunningService> {
  const docker = new Docker();
  const instance = instanceOf(cfg.dataDir);
  const containers = new Map<string, Promise<Docker.Container>>();
  let engineUp = false;
  let oomEvents: NodeJS.ReadableStream | undefined;
  const server = new RpcServer({ maxMessageBytes: cfg.maxMessageBytes });

  const checkEngine = async () => {
    const up = await docker.ping().then(
      () => true,
      () => false,
    );
    if (up !== engineUp) {
      engineUp = up;
      server.setStatus(SandboxService.typeName, up ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
      server.setStatus("", up ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
      if (up) logger.info("Docker engine reachable");
      if (up && !oomEvents) oomEvents = await watchOoms();
      else logger.error(`no Docker engine at ${process.env.DOCKER_HOST ?? "/var/run/docker.sock"}: start dockerd or set DOCKER_HOST`);
    }
    return up;
  };
  const requireEngine = async () => {
    if (!(engineUp || (await checkEngine()))) {
      throw unavailable(`no Docker engine reachable at ${process.env.DOCKER_HOST ?? "/var/run/docker.sock"}: start dockerd (or set DOCKER_HOST) and retry`);
    }
  };

  /** When each session's sandbox was last used, for the reaper. */
  const lastUsed = new Map<string, number>();

  /**
   * Removes this instance's containers that are stopped (orphans of a crash or of the engine),
   * older than the maximum age, or unused for the idle time with no command running. Containers
   * of other instances are never touched. At start-up, running containers left by a previous
   * process count as used now: their sessions may come back.
   */
  const reap = async (): Promise<number> => {
    const now = Date.now();
    const list = await docker.listContainers({ all: true, filters: { label: [`troupe.instance=${instance}`, "troupe.owner=troupe-sandbox"] } });
    let removed = 0;
    for (const c of list) {
      const session = c.Labels["troupe.session"] ?? "";
      const created = Number(c.Labels["troupe.created"] ?? c.Created * 1000);
      if (c.State === "running" && !lastUsed.has(session)) lastUsed.set(session, now);
      const busy = (running.get(session)?.size ?? 0) > 0;
      const why =
        c.State !== "running" ? "stopped" : now - created > cfg.sandboxMaxAgeMs ? "past its maximum age" : !busy && now - lastUsed.get(session)! > cfg.sandboxIdleMs ? "idle" : undefined;
      if (!why) continue;
      containers.delete(session);
      lastUsed.delete(session);
      await docker
        .getContainer(c.Id)
        .remove({ force: true })
        .then(
          () => {
            removed++;
            logger.info(`removed the sandbox of session ${session}: ${why}`);
          },
          (err: Error) => logger.warn("could not remove a sandbox", { container: c.Id.slice(0, 12), error: err.message }),
        );
    }
    return removed;
  };

  /** Output streams of running commands, by session, so a dying container can end them. */
  const running = new Map<string, Set<{ destroy(): void }>>();
  /**
   * Sessions whose last command was SIGKILLed: their container may have died with it (gVisor
   * ends the whole sandbox at its memory limit, and the engine may still say "running" for a
   * moment). The next command first checks with a trivial one, and gets a new container if needed.
   */
  const suspect = new Set<string>();
  const answers = (container: Docker.Container): Promise<boolean> =>
    runBriefly(container, ["true"]).then(
      async (exec) => (await exec.inspect()).ExitCode === 0,
      () => false,
    );
  const sandboxFor = async (sessionId: string): Promise<Docker.Container> => {
    if (suspect.delete(sessionId)) {
      const cached = await containers.get(sessionId)?.catch(() => undefined);
      if (cached && !(await answers(cached))) {
        logger.warn(`the sandbox of session ${sessionId} stopped answering; replacing it`);
        containers.delete(sessionId);
        await cached.remove({ force: true }).catch(() => undefined);
      }
    }
    let p = containers.get(sessionId);
    if (!p) {
      p = ensureContainer(sessionId);
      containers.set(sessionId, p);
      p.catch(() => containers.delete(sessionId));
    }
    return p;
  };

  const ensureContainer = async (sessionId: string): Promise<Docker.Container> => {
    const existing = docker.getContainer(containerName(instance, sessionId));
    const state = await existing.inspect().then(
      (info) => info.State,
      () => undefined,
    );
    if (state?.Running) return existing;
    if (state) await existing.remove({ force: true });
    const spec = containerSpec(cfg.sandboxImage, cfg.sandboxRuntime, instance, sessionId, DEFAULT_LIMITS);
    let container: Docker.Container;
    try {
      container = await docker.createContainer(spec);
    } catch (err) {
      const status = (err as { statusCode?: number }).statusCode;
      if (status === 404) throw failedPrecondition(`sandbox image ${cfg.sandboxImage} is missing: build it with \`make sandbox-image\``);
      throw err;
    }
    await container.start();
    return container;
  };

  /**
   * Ends every process the session's commands started (see the header comment); resolves once
   * done. The kill is itself a process in the container, so a fork bomb that holds every pid can
   * keep it from starting: after KILL_TIMEOUT_MS the container is restarted instead, which ends
   * everything in it (and empties its tmpfs workspace, the price of a sandbox that stayed killable).
   */
  const killCommands = async (container: Docker.Container) => {
    try {
      await runBriefly(container, ["kill", "-9", "-1"]);
    } catch (err) {
      logger.warn("could not kill the commands from inside the sandbox; restarting it", { container: container.id.slice(0, 12), error: (err as Error).message });
      await container.restart({ t: 0 });
    }
  };

  // The engine reports an OOM kill anywhere in a container's cgroup as an event (runc does; gVisor
  // enforces its limit inside the sandbox and reports nothing). Counted per container, so an exec
  // can tell whether one happened while it ran. Containers that die are forgotten.
  const oomKills = new Map<string, number>();
  const watchOoms = async () => {
    try {
      const events = (await docker.getEvents({ filters: { type: ["container"], event: ["oom", "die"], label: [`troupe.instance=${instance}`] } })) as NodeJS.ReadableStream;
      events.on("data", (chunk: Buffer) => {
        for (const line of chunk.toString("utf8").split("\n")) {
          if (!line.trim()) continue;
          try {
            const ev = JSON.parse(line) as { Action?: string; Actor?: { Attributes?: Record<string, string> } };
            const attrs = ev.Actor?.Attributes ?? {};
            if (ev.Action === "oom" && attrs.name) oomKills.set(attrs.name, (oomKills.get(attrs.name) ?? 0) + 1);
            // A sandbox that died (gVisor ends the whole sandbox at its memory limit) is made anew
            // on next use.
            const session = attrs["troupe.session"];
            if (ev.Action === "die" && session) {
              containers.delete(session);
              // Commands that were running in it are over: end their output streams.
              for (const st of running.get(session) ?? []) st.destroy();
            }
          } catch {
            // a partial line; the engine sends one event per line
          }
        }
      });
      events.on("error", () => undefined);
      return events;
    } catch {
      return undefined;
    }
  };

  server.add(SandboxService, {
    async exec(call) {
      const req = call.request;
      invalidArgumentIf(!isSessionId(req.sessionId), "session_id is missing or malformed");
      invalidArgumentIf(req.command.trim() === "", "command must not be empty");
      invalidArgumentIf(req.command.length > MAX_COMMAND_CHARS, `command is over ${MAX_COMMAND_CHARS} characters`);
      invalidArgumentIf(req.timeoutMs > MAX_TIMEOUT_MS, `timeout_ms must be at most ${MAX_TIMEOUT_MS}`);
      await requireEngine();
      const execOptions: Docker.ExecCreateOptions = {
        Cmd: ["/bin/sh", "-c", req.command],
        User: TOOL_USER,
        WorkingDir: WORKSPACE,
        Env: ["PATH=/bin:/usr/bin", `HOME=${WORKSPACE}`],
        AttachStdin: req.stdin.length > 0,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      };
      let container = await sandboxFor(req.sessionId);
      let exec: Docker.Exec;
      try {
        exec = await container.exec(execOptions);
      } catch (err) {
        // 409: the cached container has stopped (it died, and the engine's event has not reached
        // us yet). Forget it; the session gets a new sandbox.
        if ((err as { statusCode?: number }).statusCode !== 409) throw err;
        containers.delete(req.sessionId);
        container = await sandboxFor(req.sessionId);
        exec = await container.exec(execOptions);
      }
      lastUsed.set(req.sessionId, Date.now());
      const name = containerName(instance, req.sessionId);
      const oomsBefore = oomKills.get(name) ?? 0;
      const started = Date.now();
      const stream = (await exec.start({ hijack: true, stdin: req.stdin.length > 0 })) as NodeJS.ReadWriteStream & AsyncIterable<Buffer> & { destroy(): void; destroyed: boolean };
      if (req.stdin.length > 0) stream.end(Buffer.from(req.stdin));
      let timedOut = false;
      let cancelled = false;
      const timeoutMs = req.timeoutMs || cfg.execTimeoutMs;
      const kill = () => killCommands(container).catch((err: Error) => logger.warn("kill failed", { session: req.sessionId, error: err.message }));
      let lastResort: NodeJS.Timeout | undefined;
      const timer = setTimeout(() => {
        timedOut = true;
        void kill();
        // If even the kill (and the restart after it) leaves the engine's stream open, a sandbox
        // runtime has wedged: stop waiting for it, and check the container before its next use.
        lastResort = setTimeout(() => {
          suspect.add(req.sessionId);
          stream.destroy();
        }, 3 * KILL_TIMEOUT_MS);
      }, timeoutMs);
      call.once("cancelled", () => {
        cancelled = true;
        void kill();
      });
      let sent = 0;
      let truncated = false;
      const streams = running.get(req.sessionId) ?? new Set();
      running.set(req.sessionId, streams);
      streams.add(stream);
      try {
        for await (const part of demux(stream)) {
          if (cancelled) break;
          if (sent >= MAX_OUTPUT_BYTES) {
            truncated = true;
            continue; // keep reading so the process is not blocked on a full pipe
          }
          const data = part.data.subarray(0, MAX_OUTPUT_BYTES - sent);
          truncated ||= data.length < part.data.length;
          sent += data.length;
          const msg = create(ExecResponseSchema, { kind: { case: part.stream, value: data } });
          const wait = write(call, msg);
          if (wait) await wait;
        }
      } catch (err) {
        // The stream was ended under us: the container died (see the event watch).
        if (!stream.destroyed) throw err;
      } finally {
        clearTimeout(timer);
        clearTimeout(lastResort);
        stream.destroy();
        streams.delete(stream);
        if (streams.size === 0) running.delete(req.sessionId);
      }
      if (cancelled) return;
      const info = await exec.inspect().catch(() => ({ ExitCode: null as number | null }));
      // A SIGKILL we did not send: give the engine's OOM event a moment to arrive.
      if (info.ExitCode === 137 || info.ExitCode === null) suspect.add(req.sessionId);
      if (info.ExitCode === 137 && !timedOut && (oomKills.get(name) ?? 0) === oomsBefore) await new Promise((r) => setTimeout(r, 250));
      const oomKilled = (oomKills.get(name) ?? 0) > oomsBefore;
      call.write(
        create(ExecResponseSchema, {
          kind: { case: "exit", value: { exitCode: info.ExitCode ?? -1, timedOut, truncated, oomKilled, durationMs: Date.now() - started } },
        }),
      );
      call.end();
    },

    async killProcesses(req) {
      invalidArgumentIf(!isSessionId(req.sessionId), "session_id is missing or malformed");
      await requireEngine();
      const container = docker.getContainer(containerName(instance, req.sessionId));
      const running = await container.inspect().then((c) => c.State.Running, () => false);
      if (!running) return { sandboxFound: false };
      await killCommands(container);
      return { sandboxFound: true };
    },

    async releaseSandbox(req) {
      invalidArgumentIf(!isSessionId(req.sessionId), "session_id is missing or malformed");
      await requireEngine();
      containers.delete(req.sessionId);
      const removed = await docker
        .getContainer(containerName(instance, req.sessionId))
        .remove({ force: true })
        .then(
          () => true,
          (err: { statusCode?: number }) => {
            if (err.statusCode === 404) return false;
            throw new RpcError(Status.INTERNAL, `could not remove the sandbox: ${String(err)}`);
          },
        );
      return { removed };
    },
  });

  await checkEngine();
  if (!engineUp) {
    // checkEngine only logs on a change; say it once at start as well.
    server.setStatus(SandboxService.typeName, ServingStatus.NOT_SERVING);
    server.setStatus("", ServingStatus.NOT_SERVING);
    logger.error(`no Docker engine at ${process.env.DOCKER_HOST ?? "/var/run/docker.sock"}: tools will fail until dockerd runs`);
  }
  const watch = setInterval(() => void checkEngine(), 5000);
  watch.unref();
  const reapAll = () => (engineUp ? reap().catch((err: Error) => logger.warn("reaper failed", { error: err.message })) : undefined);
  await reapAll();
  const reaper = setInterval(() => void reapAll(), Math.max(500, Math.min(60_000, cfg.sandboxIdleMs / 4)));
  reaper.unref();
  const port = await server.listen(cfg.addr.sandbox);
  logger.info(`sandbox serving on port ${port}`, { image: cfg.sandboxImage, runtime: cfg.sandboxRuntime, instance });
  return {
    async drain() {
      clearInterval(watch);
      clearInterval(reaper);
      (oomEvents as { destroy?: () => void } | undefined)?.destroy?.();
      await server.drain(cfg.drainGraceMs);
    },
  };
}
