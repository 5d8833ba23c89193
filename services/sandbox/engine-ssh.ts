// An ssh:// engine is reached as the docker CLI reaches it: an SSH session to the host running
// `docker system dial-stdio` (docker-modem does this with ssh2). What the CLI gets from OpenSSH
// and ssh2 does not do by itself is here:
// - the host's key is checked against ~/.ssh/known_hosts (plain or hashed entries, [host]:port for
//   a port other than 22); an unknown host is refused, never trusted on first use;
// - the user's key: the SSH agent (SSH_AUTH_SOCK) when one runs, else the first of
//   ~/.ssh/id_ed25519, id_ecdsa and id_rsa present (unencrypted; an encrypted key needs the agent).
import { createHmac } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";

/** What reaching an ssh engine needs from the host: the home directory and the agent's socket. */
export interface SshSettings {
  homeDir?: string;
  sshAuthSock?: string;
}

/** ssh2's connection options for the engine at host:port. */
export function sshOptions(host: string, port: number, settings: SshSettings): Record<string, unknown> {
  const sshDir = path.join(settings.homeDir ?? "", ".ssh");
  const known = knownKeys(path.join(sshDir, "known_hosts"), host, port);
  const auth: Record<string, unknown> = settings.sshAuthSock
    ? { agent: settings.sshAuthSock }
    : { privateKey: firstKey(sshDir) };
  return {
    ...auth,
    readyTimeout: 20_000,
    // ssh2 hands over the server's key blob; it must be one known_hosts lists for this host.
    hostVerifier: (key: Buffer) => known.has(key.toString("base64")),
  };
}

/** The key blobs (base64) known_hosts lists for host:port. */
export function knownKeys(file: string, host: string, port: number): Set<string> {
  const name = port === 22 ? host : `[${host}]:${port}`;
  const keys = new Set<string>();
  let text = "";
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return keys; // no known_hosts: no host is known
  }
  for (const line of text.split("\n")) {
    const fields = line.trim().split(/\s+/);
    if (fields.length < 3 || fields[0].startsWith("#") || fields[0].startsWith("@")) continue;
    const [hosts, , blob] = fields;
    if (hosts.split(",").some((h) => matches(h, name))) keys.add(blob);
  }
  return keys;
}

/** One host pattern of known_hosts against a name: plain, or hashed as |1|salt|HMAC-SHA1(name). */
function matches(pattern: string, name: string): boolean {
  if (!pattern.startsWith("|1|")) return pattern === name;
  const [, , salt, hash] = pattern.split("|");
  if (!salt || !hash) return false;
  return createHmac("sha1", Buffer.from(salt, "base64")).update(name).digest("base64") === hash;
}

function firstKey(sshDir: string): Buffer | undefined {
  for (const name of ["id_ed25519", "id_ecdsa", "id_rsa"]) {
    const file = path.join(sshDir, name);
    if (existsSync(file)) return readFileSync(file);
  }
  return undefined;
}
