// `troupe sandbox`: the operator's view of the sandbox service.
//   troupe sandbox ls                                   this deployment's sandboxes
//   troupe sandbox exec --session ID [--stdin] -- CMD ARG...   run CMD with its arguments in the
//                                                       session's sandbox, as `docker exec` does; exits with its code
//   troupe sandbox rm --session ID                      remove the session's sandbox and workspace
//   troupe sandbox snapshot SESSION [--name N]          archive the session's workspace as a snapshot
//   troupe sandbox snapshots                            the tenant's snapshots, and its workspace quota
//   troupe sandbox restore SNAPSHOT --session ID [--replace]   make a snapshot the session's workspace
//   troupe sandbox snapshot-rm SNAPSHOT                 delete a snapshot
// --agent NAME names the session's agent (it matters when TROUPE_SANDBOX_SCOPE=agent); --tenant and
// --principal name the session's owner (default: the development identity, local/dev).
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { DEV_IDENTITY, identityHeaders, internalCredentials } from "../shared/auth/auth.js";
import { loadConfig } from "../shared/config/config.js";
import { describeError } from "../shared/errors.js";
import { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import { createClient } from "../shared/rpc.js";
import { printTable } from "./table.js";

const USAGE = `usage: troupe sandbox ls
       troupe sandbox exec --session ID [--tenant T] [--principal P] [--agent NAME] [--timeout-ms N] [--stdin] -- COMMAND [ARG...]
       troupe sandbox rm --session ID [--tenant T] [--principal P] [--agent NAME]
       troupe sandbox snapshot SESSION [--name N] [--tenant T] [--principal P] [--agent NAME]
       troupe sandbox snapshots [--tenant T]
       troupe sandbox restore SNAPSHOT --session ID [--replace] [--tenant T] [--principal P] [--agent NAME]
       troupe sandbox snapshot-rm SNAPSHOT [--tenant T]
`;

const MIB = 1024 * 1024;

/** One word for /bin/sh, quoted so the shell passes it on unchanged. */
const shellQuote = (word: string): string =>
  /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;

/**
 * The sandbox runs a command line with /bin/sh -c; an argv becomes a line whose words the shell
 * splits back exactly as given (`-- sh -c 'echo a; echo b'` runs that script, as docker exec would).
 */
export const argvToCommand = (argv: readonly string[]): string => argv.map(shellQuote).join(" ");

const ago = (ms: number | undefined) => {
  if (ms === undefined) return "-";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 120 ? `${s}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
};

async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

export async function sandboxCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const cfg = loadConfig(rest, undefined, {
    session: { type: "string" },
    agent: { type: "string" },
    tenant: { type: "string" },
    principal: { type: "string" },
    "timeout-ms": { type: "string" },
    stdin: { type: "boolean" },
    name: { type: "string" },
    replace: { type: "boolean" },
  });
  const flags = cfg.flags as Record<string, string | boolean | undefined>;
  const sessionId = (flags.session as string | undefined) ?? "";
  const agentId = (flags.agent as string | undefined) ?? "";
  const owner = {
    tenant: (flags.tenant as string | undefined) ?? DEV_IDENTITY.tenant,
    principal: (flags.principal as string | undefined) ?? DEV_IDENTITY.principal,
  };
  // An operator's tool on a machine of the stack: it speaks to the sandbox service as Troupe does,
  // for the session's owner.
  const internal = await internalCredentials(cfg.dataDir, cfg.internalToken, cfg.internalCa);
  const client = createClient(SandboxService, cfg.addr.sandbox, {
    headers: { ...internal.headers, ...identityHeaders(owner) },
    tls: internal.tls,
  });
  try {
    switch (sub) {
      case "ls": {
        const { sandboxes } = await client.listSandboxes({}, { timeoutMs: 10_000 });
        const rows = sandboxes.map((s) => [
          s.name,
          s.pooled && !s.scopeKey ? "(pool)" : s.scopeKey || "?",
          s.state,
          String(s.runningCommands),
          ago(s.createTime ? timestampMs(s.createTime) : undefined),
          ago(s.lastUseTime ? timestampMs(s.lastUseTime) : undefined),
        ]);
        const head = ["NAME", "SCOPE", "STATE", "RUNNING", "CREATED", "LAST USED"];
        printTable(head, rows);
        return 0;
      }
      case "exec": {
        const command = argvToCommand(cfg.rest);
        if (!sessionId || cfg.rest.length === 0) {
          process.stderr.write(USAGE);
          return 2;
        }
        const stdin = flags.stdin ? await readStdin() : new Uint8Array();
        const timeoutMs = Number(flags["timeout-ms"] ?? 0);
        let code = 1;
        for await (const m of client.exec({ sessionId, agentId, command, stdin, timeoutMs })) {
          if (m.kind.case === "stdout") process.stdout.write(m.kind.value);
          else if (m.kind.case === "stderr") process.stderr.write(m.kind.value);
          else if (m.kind.case === "exit") {
            const e = m.kind.value;
            code = e.exitCode;
            const notes = [
              e.timedOut && "timed out",
              e.oomKilled && "out of memory",
              e.truncated && "output truncated",
            ].filter(Boolean);
            if (notes.length) process.stderr.write(`troupe sandbox: ${notes.join(", ")}\n`);
          }
        }
        return code < 0 ? 1 : Math.min(code, 255);
      }
      case "rm": {
        if (!sessionId) {
          process.stderr.write(USAGE);
          return 2;
        }
        const { removed } = await client.releaseSandbox({ sessionId, agentId }, { timeoutMs: 30_000 });
        process.stdout.write(removed ? `removed the sandbox of ${sessionId}\n` : `${sessionId} had no sandbox\n`);
        return 0;
      }
      case "snapshot": {
        const [session] = cfg.rest;
        if (!session || cfg.rest.length > 1) {
          process.stderr.write(USAGE);
          return 2;
        }
        const name = (flags.name as string | undefined) ?? "";
        const { snapshot } = await client.createSnapshot({ sessionId: session, agentId, name }, { timeoutMs: 180_000 });
        process.stdout.write(`${snapshot?.snapshotId}\n`);
        return 0;
      }
      case "snapshots": {
        const { snapshots, usedBytes, quotaBytes } = await client.listSnapshots({}, { timeoutMs: 10_000 });
        const rows = snapshots.map((s) => [
          s.snapshotId,
          s.name || "-",
          s.sourceSessionId,
          `${(Number(s.sizeBytes) / MIB).toFixed(1)} MiB`,
          ago(s.createTime ? timestampMs(s.createTime) : undefined),
        ]);
        printTable(["SNAPSHOT", "NAME", "FROM SESSION", "SIZE", "CREATED"], rows);
        process.stdout.write(
          `tenant ${owner.tenant} keeps ${(Number(usedBytes) / MIB).toFixed(1)} of ${Number(quotaBytes) / MIB} MiB (saved workspaces and snapshots)\n`,
        );
        return 0;
      }
      case "restore": {
        const [snapshotId] = cfg.rest;
        if (!snapshotId || !sessionId || cfg.rest.length > 1) {
          process.stderr.write(USAGE);
          return 2;
        }
        const replace = flags.replace === true;
        await client.restoreSnapshot({ snapshotId, sessionId, agentId, replace }, { timeoutMs: 60_000 });
        process.stdout.write(`${sessionId}'s next command finds the files of ${snapshotId}\n`);
        return 0;
      }
      case "snapshot-rm": {
        const [snapshotId] = cfg.rest;
        if (!snapshotId || cfg.rest.length > 1) {
          process.stderr.write(USAGE);
          return 2;
        }
        await client.deleteSnapshot({ snapshotId }, { timeoutMs: 10_000 });
        process.stdout.write(`deleted ${snapshotId}\n`);
        return 0;
      }
      default:
        process.stderr.write(USAGE);
        return 2;
    }
  } catch (err) {
    process.stderr.write(`troupe sandbox: ${describeError(err)}\n`);
    return 1;
  } finally {
    client.close();
  }
}
