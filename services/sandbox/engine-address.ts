// Where the Docker engine is, found as the docker CLI finds it (docs.docker.com/engine/manage-resources/contexts):
//
// 1. DOCKER_HOST, when set: unix:///path (or a bare /path), tcp://host:port (TLS with
//    DOCKER_TLS_VERIFY, certificates in DOCKER_CERT_PATH), https://host:port, ssh://[user@]host[:port].
// 2. Else the context DOCKER_CONTEXT names, else the config's `currentContext`
//    (DOCKER_CONFIG/config.json): its endpoint in contexts/meta/<sha256 of the name>/meta.json,
//    its TLS material in contexts/tls/<sha256>/docker/. A context named but not found is refused.
// 3. Else the first socket present of /var/run/docker.sock (the system engine),
//    $XDG_RUNTIME_DIR/docker.sock (rootless Docker) and ~/.docker/run/docker.sock (Docker Desktop);
//    none present: /var/run/docker.sock, so the error names the usual place.
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import type { SshSettings } from "./engine-ssh.js";

/** The engine settings (config.ts): the docker CLI's own variables. */
export interface EngineSettings {
  dockerHost: string;
  dockerTlsVerify: boolean;
  /** DOCKER_CERT_PATH, defaulting to the config directory. */
  dockerCertPath: string;
  /** DOCKER_CONTEXT; empty: the config's current context. */
  dockerContext?: string;
  /** DOCKER_CONFIG; default ~/.docker. */
  dockerConfigDir?: string;
  /** XDG_RUNTIME_DIR, where a rootless engine's socket is. */
  runtimeDir?: string;
  /** The home directory: Docker Desktop's socket, and ~/.ssh for an ssh:// engine. */
  homeDir?: string;
  /** SSH_AUTH_SOCK: the SSH agent an ssh:// engine is reached with. */
  sshAuthSock?: string;
}

/** TLS material for an https engine. */
export interface EngineTls {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
}

/** How to reach the engine, and which setting said so (for messages). */
export type EngineAddress = { from: string } & (
  | { socketPath: string }
  | { protocol: "http"; host: string; port: number }
  | { protocol: "https"; host: string; port: number; tls?: EngineTls }
  | { protocol: "ssh"; host: string; port: number; username?: string; ssh: SshSettings }
);

const SYSTEM_SOCKET = "/var/run/docker.sock";

/** Where the settings point. Throws, naming the setting, for what cannot be reached. */
export function engineAddress(settings: EngineSettings, exists: (p: string) => boolean = existsSync): EngineAddress {
  if (settings.dockerHost)
    return parseHost(settings.dockerHost, "DOCKER_HOST", {
      always: settings.dockerTlsVerify,
      dir: settings.dockerCertPath,
      ssh: sshOf(settings),
    });
  const configDir = settings.dockerConfigDir || path.join(settings.homeDir ?? "", ".docker");
  const context = settings.dockerContext || currentContext(configDir);
  if (context && context !== "default") return contextAddress(context, configDir, sshOf(settings));
  const candidates = [
    SYSTEM_SOCKET,
    ...(settings.runtimeDir ? [path.join(settings.runtimeDir, "docker.sock")] : []),
    ...(settings.homeDir ? [path.join(settings.homeDir, ".docker", "run", "docker.sock")] : []),
  ];
  return { from: "the default socket", socketPath: candidates.find(exists) ?? SYSTEM_SOCKET };
}

/** A short name of the address for messages: unix:///path, tcp://host:port, ssh://host. */
export function describeEngine(address: EngineAddress): string {
  if ("socketPath" in address) return `unix://${address.socketPath} (${address.from})`;
  const scheme = address.protocol === "http" ? "tcp" : address.protocol;
  return `${scheme}://${address.host}:${address.port} (${address.from})`;
}

/**
 * One endpoint. TLS when the scheme is https, when DOCKER_TLS_VERIFY is set (`tls.always`), or,
 * for a context, when its TLS material was stored (`tls.always` false, the files present).
 */
function parseHost(host: string, from: string, tls: { always: boolean; dir: string; ssh: SshSettings }): EngineAddress {
  if (host.startsWith("unix://") && host.length > "unix://".length)
    return { from, socketPath: host.slice("unix://".length) };
  if (host.startsWith("/")) return { from, socketPath: host };
  const m = /^(tcp|http|https|ssh):\/\/(?:([^@/:]+)@)?(\[[0-9a-fA-F:.]+\]|[^/:@[\]]+)(?::(\d{1,5}))?\/?$/.exec(host);
  if (!m)
    throw new Error(
      `${from}=${host}: Troupe reaches an engine at unix:///path, tcp://host:port, https://host:port or ssh://[user@]host[:port]`,
    );
  const [, scheme, username, rawHost, port] = m;
  const hostname = rawHost.replace(/^\[|\]$/g, "");
  if (scheme === "ssh")
    return { from, protocol: "ssh", host: hostname, port: port ? Number(port) : 22, username, ssh: tls.ssh };
  if (username) throw new Error(`${from}=${host}: a user name belongs to ssh:// only`);
  const stored = !tls.always && existsSync(path.join(tls.dir, "cert.pem"));
  if (!(scheme === "https" || tls.always || stored))
    return { from, protocol: "http", host: hostname, port: port ? Number(port) : 2375 };
  const pem = (name: string) => readFileSync(path.join(tls.dir, name));
  const address = { from, protocol: "https" as const, host: hostname, port: port ? Number(port) : 2376 };
  // https:// with no client certificate stored: the server's TLS only, checked against the system's CAs.
  if (!(tls.always || stored)) return address;
  return { ...address, tls: { ca: pem("ca.pem"), cert: pem("cert.pem"), key: pem("key.pem") } };
}

/** The config's current context; none when there is no config or it names none. */
function currentContext(configDir: string): string | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(configDir, "config.json"), "utf8");
  } catch {
    return undefined; // no config: the default context
  }
  try {
    const doc = JSON.parse(text) as { currentContext?: unknown };
    return typeof doc.currentContext === "string" ? doc.currentContext : undefined;
  } catch (err) {
    throw new Error(`${path.join(configDir, "config.json")}: not JSON (${(err as Error).message})`);
  }
}

/** A named context's docker endpoint, as `docker context create` stores it. */
function contextAddress(name: string, configDir: string, ssh: SshSettings): EngineAddress {
  const id = createHash("sha256").update(name).digest("hex");
  const metaFile = path.join(configDir, "contexts", "meta", id, "meta.json");
  let meta: { Endpoints?: { docker?: { Host?: unknown } } };
  try {
    meta = JSON.parse(readFileSync(metaFile, "utf8"));
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === "ENOENT";
    throw new Error(
      missing
        ? `docker context "${name}": not found in ${configDir} (docker context ls lists them)`
        : `docker context "${name}": ${metaFile} unreadable (${(err as Error).message})`,
    );
  }
  const host = meta.Endpoints?.docker?.Host;
  if (typeof host !== "string" || !host)
    throw new Error(`docker context "${name}": ${metaFile} names no docker endpoint`);
  const tlsDir = path.join(configDir, "contexts", "tls", id, "docker");
  return parseHost(host, `docker context "${name}"`, { always: false, dir: tlsDir, ssh });
}

const sshOf = (settings: EngineSettings): SshSettings => ({
  homeDir: settings.homeDir,
  sshAuthSock: settings.sshAuthSock,
});
