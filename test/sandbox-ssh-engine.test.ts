// A Docker engine reached over SSH (DOCKER_HOST=ssh://user@host:port), as the docker CLI reaches
// one: an SSH session running `docker system dial-stdio` on the far side. The far side here is an
// SSH server (ssh2's, speaking RFC 4253/4252) that accepts one user key and, for that exec, runs
// the real docker CLI's dial-stdio against this machine's real engine. The sandbox service runs a
// command through it; a host whose key is not in known_hosts is refused before anything runs.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { Engine, engineAddress } from "../services/sandbox/engine.js";
import { exec, type SandboxClient } from "./helpers/sandbox.js";
import { startStack, type Stack } from "./helpers/stack.js";

// ssh2 ships without types; the few parts used here, typed loosely.
type SshKey = { getPublicSSH(): Buffer; verify(data: Buffer, sig: Buffer, algo?: string): boolean };
const ssh2 = createRequire(import.meta.url)("ssh2") as {
  Server: new (
    opts: { hostKeys: string[] },
    onClient: (client: import("node:events").EventEmitter) => void,
  ) => import("node:net").Server;
  utils: {
    generateKeyPairSync(type: "ed25519"): { private: string; public: string };
    parseKey(key: string): SshKey | Error;
  };
};

describe("a Docker engine over ssh://", () => {
  let home: string;
  let server: import("node:net").Server;
  let port: number;
  const execs: string[] = [];
  const hostKey = ssh2.utils.generateKeyPairSync("ed25519");
  const userKey = ssh2.utils.generateKeyPairSync("ed25519");
  const userPublic = ssh2.utils.parseKey(userKey.public) as SshKey;

  before(async () => {
    home = await mkdtemp(path.join(os.tmpdir(), "troupe-ssh-home-"));
    server = new ssh2.Server({ hostKeys: [hostKey.private] }, (client) => {
      client.on("authentication", (ctx: SshAuth) => {
        const ours = ctx.method === "publickey" && ctx.key?.data.equals(userPublic.getPublicSSH());
        if (!ours || ctx.username !== "ops") return ctx.reject(["publickey"]);
        // Without a signature the client only asks whether the key would do (RFC 4252 7).
        if (!ctx.signature || userPublic.verify(ctx.blob!, ctx.signature, ctx.hashAlgo)) return ctx.accept();
        ctx.reject();
      });
      client.on("ready", () =>
        client.on("session", (accept: () => import("node:events").EventEmitter) =>
          accept().on(
            "exec",
            (acceptExec: () => import("node:stream").Duplex, reject: () => void, info: { command: string }) => {
              execs.push(info.command);
              if (info.command !== "docker system dial-stdio") return reject();
              const channel = acceptExec() as import("node:stream").Duplex & { exit(code: number): void };
              const dial = spawn("docker", ["system", "dial-stdio"], { stdio: ["pipe", "pipe", "inherit"] });
              channel.pipe(dial.stdin);
              dial.stdout.pipe(channel);
              dial.on("exit", (code) => {
                channel.exit(code ?? 1);
                channel.end();
              });
              channel.on("close", () => dial.kill());
            },
          ),
        ),
      );
      client.on("error", () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
    await mkdir(path.join(home, ".ssh"), { mode: 0o700 });
    await writeFile(path.join(home, ".ssh", "id_ed25519"), userKey.private, { mode: 0o600 });
  });

  after(async () => {
    server?.close();
    await rm(home, { recursive: true, force: true });
  });

  /** known_hosts naming this server with `key` (OpenSSH's form for a port other than 22). */
  const knownHosts = (key: string) =>
    writeFile(path.join(home, ".ssh", "known_hosts"), `[127.0.0.1]:${port} ${key.split(" ").slice(0, 2).join(" ")}\n`);

  const settings = () => ({
    dockerHost: `ssh://ops@127.0.0.1:${port}`,
    dockerTlsVerify: false,
    dockerCertPath: "",
    homeDir: home,
  });

  test("a host whose key is not the one known_hosts lists is refused before any command runs", async () => {
    await knownHosts(ssh2.utils.generateKeyPairSync("ed25519").public);
    const before = execs.length;
    const engine = new Engine(engineAddress(settings()));
    try {
      await assert.rejects(engine.ping(), /verif|host/i);
    } finally {
      engine.close();
    }
    assert.equal(execs.length, before, "nothing ran on the unknown host");
  });

  describe("with the host known", () => {
    let stack: Stack;
    let sandbox: SandboxClient;
    before(async () => {
      await knownHosts(hostKey.public);
      stack = await startStack({
        services: ["sandbox"],
        env: { DOCKER_HOST: `ssh://ops@127.0.0.1:${port}`, HOME: home, SSH_AUTH_SOCK: undefined },
      });
      sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
    });
    after(async () => {
      await sandbox?.releaseSandbox({ sessionId: "over-ssh" }).catch(() => undefined);
      sandbox?.close();
      await stack?.stop();
    });

    test("the sandbox service makes, attaches to and runs a container through it", async () => {
      const r = await exec(sandbox, "over-ssh", "echo hello from $(hostname)");
      assert.equal(r.exit.exitCode, 0);
      assert.match(r.out, /^hello from /);
      assert.ok(execs.includes("docker system dial-stdio"), "the engine was reached over SSH");
    });
  });
});

/** The parts of ssh2's authentication context used here. */
interface SshAuth {
  method: string;
  username: string;
  key?: { data: Buffer };
  signature?: Buffer;
  blob?: Buffer;
  hashAlgo?: string;
  accept(): void;
  reject(methods?: string[]): void;
}
