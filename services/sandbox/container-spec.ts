// What every sandbox container is made with: the hardened settings, the limits, the agent's user and
// capabilities, the seccomp filter, and the names and labels that tie a container to its
// deployment and scope key. docs/sandbox.md says why each setting is what it is.
import { createHash } from "node:crypto";
import type { ContainerSpec } from "./engine.js";
import { sandboxSeccompProfile } from "./seccomp.js";

const SECCOMP_PROFILE = sandboxSeccompProfile();

const WORKSPACE = "/workspace";
/**
 * The agent starts as root with three capabilities and is the container's PID 1; it runs every
 * command and file operation as 65534 (troupe-agent.c). So the attach pipes it holds belong to
 * another user than anything untrusted: no command opens /proc/1/fd, signals or traces it.
 */
const AGENT_USER = "0:0";
const AGENT_CAPABILITIES = ["SETUID", "SETGID", "KILL"];

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

/**
 * Inodes of each tmpfs, and the size of /dev/shm (Docker's own is 64 MiB with no inode bound):
 * a flood of empty files ends at these under runc. gVisor ignores nr_inodes; there its tmpfs
 * lives in the sandbox's own memory, under the memory limit.
 */
const TMP_INODES = 8192;
const WORKSPACE_INODES = 65_536;
const SHM_INODES = 4096;
const SHM_BYTES = 16 * 1024 * 1024;

export interface FleetOptions {
  image: string;
  runtime: string;
  /** This deployment's sandboxes (see instanceOf); part of every name and label. */
  instance: string;
  limits: SandboxLimits;
  poolSize: number;
  idleMs: number;
  maxAgeMs: number;
}

/**
 * An instance is one Troupe deployment's sandboxes (by default, one data directory). It is part of
 * every container's name and labels, so two deployments on one host never share a container.
 */
export const instanceOf = (dataDir: string): string => createHash("sha256").update(dataDir).digest("hex").slice(0, 12);

export const containerName = (instance: string, key: string): string =>
  `troupe-sbx-${instance}-${createHash("sha256").update(key).digest("hex").slice(0, 20)}`;

export const poolPrefix = (instance: string) => `troupe-sbx-${instance}-pool-`;

/**
 * The engine's pids limit for a sandbox. Under runsc on the ptrace platform every sandboxed
 * process costs the host about ten (its stub process and threads), and gVisor ends the whole
 * sandbox when the host limit is hit: measured here, 256 ended it at about 20 orphaned
 * subshells. So runsc gets eight times the limit, which holds about as many sandboxed processes.
 */
const hostPidsLimit = (opts: FleetOptions): number =>
  opts.runtime === "runsc" ? opts.limits.pids * 8 : opts.limits.pids;

/** The settings every sandbox gets, name and labels aside. */
function settings(opts: FleetOptions): ContainerSpec {
  const { limits } = opts;
  return {
    Image: opts.image,
    User: AGENT_USER,
    Cmd: ["troupe-agent"],
    WorkingDir: WORKSPACE,
    // Nothing from the service's own environment reaches the container.
    Env: ["PATH=/usr/local/bin:/usr/bin:/bin", `HOME=${WORKSPACE}`],
    NetworkDisabled: true,
    // The agent's channel: stdin stays open across attachments, so a restarted service can
    // attach again and go on.
    OpenStdin: true,
    StdinOnce: false,
    AttachStdin: true,
    AttachStdout: true,
    AttachStderr: true,
    Tty: false,
    HostConfig: {
      NetworkMode: "none",
      CapDrop: ["ALL"],
      CapAdd: AGENT_CAPABILITIES,
      SecurityOpt: ["no-new-privileges", `seccomp=${SECCOMP_PROFILE}`],
      ReadonlyRootfs: true,
      // The agent is PID 1 (no docker-init holding the attach pipes): it reaps orphans itself.
      Init: false,
      PidsLimit: hostPidsLimit(opts),
      Memory: limits.memoryBytes,
      MemorySwap: limits.memoryBytes,
      NanoCpus: limits.nanoCpus,
      Ulimits: [
        { Name: "nofile", Soft: 1024, Hard: 1024 },
        { Name: "core", Soft: 0, Hard: 0 },
      ],
      Tmpfs: {
        "/tmp": `rw,nosuid,nodev,noexec,size=${limits.tmpBytes},nr_inodes=${TMP_INODES},uid=65534,gid=65534,mode=1777`,
        "/dev/shm": `rw,nosuid,nodev,noexec,size=${SHM_BYTES},nr_inodes=${SHM_INODES},mode=1777`,
        // The engine makes tmpfs noexec unless told otherwise; scripts and programs the agent
        // writes in its workspace must run (the container is the boundary, not the mount).
        [WORKSPACE]: `rw,exec,nosuid,nodev,size=${limits.workspaceBytes},nr_inodes=${WORKSPACE_INODES},uid=65534,gid=65534,mode=0700`,
      },
      // Commands talk to the service through the agent's stdout: the engine must not keep a copy.
      LogConfig: { Type: "none", Config: {} },
      Runtime: opts.runtime,
    },
  };
}

/**
 * A hash of the settings, kept as a label: containers made under other settings are replaced
 * when idle, and never adopted.
 */
export const configHash = (opts: FleetOptions) =>
  createHash("sha256")
    .update(JSON.stringify(settings(opts)))
    .digest("hex")
    .slice(0, 16);

/** A new sandbox's full spec: for a scope key, or for the pool (no key). */
export function containerSpec(opts: FleetOptions, name: string, key: string | undefined): ContainerSpec {
  const labels: Record<string, string> = {
    "troupe.owner": "troupe-sandbox",
    "troupe.instance": opts.instance,
    "troupe.created": String(Date.now()),
    "troupe.config": configHash(opts),
    "troupe.image": opts.image,
  };
  if (key === undefined) labels["troupe.pool"] = "true";
  else {
    labels["troupe.scope"] = key;
    if (key.startsWith("session:")) labels["troupe.session"] = key.slice("session:".length);
  }
  return { ...settings(opts), name, Labels: labels };
}
