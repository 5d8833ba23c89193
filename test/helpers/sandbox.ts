// Running a command through the sandbox service, for tests: its whole output and exit status;
// asserting a call fails with a status; and the container a test session's sandbox runs in.
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { waitFor } from "./stack.js";
import { containerName, instanceOf } from "../../services/sandbox/container-spec.js";
import { scopeKey } from "../../services/sandbox/scope.js";
import { DEV_IDENTITY } from "../../services/shared/auth/auth.js";
import { Status } from "../../services/shared/errors.js";
import type { SandboxService, ExecExit } from "../../services/shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient } from "../../services/shared/rpc.js";

export type SandboxClient = ServiceClient<(typeof SandboxService)["method"]>;

/** The container name the service gives the sandbox of a session (of the dev identity by default), under a data directory. */
export const sessionContainer = (dataDir: string, sessionId: string, owner = DEV_IDENTITY): string =>
  containerName(instanceOf(dataDir), scopeKey("session", owner, sessionId, ""));

export interface ExecResult {
  /** stdout and stderr as they came, decoded as UTF-8. */
  out: string;
  bytes: number;
  exit: ExecExit;
  /** What the service said of the workspace (ExecStarted.workspace_note). */
  note: string;
}

export async function exec(
  sandbox: SandboxClient,
  sessionId: string,
  command: string,
  opts: {
    timeoutMs?: number;
    stdin?: Uint8Array;
    agentId?: string;
    egress?: { allowHosts: string[]; budgetBytes?: bigint };
  } = {},
): Promise<ExecResult> {
  const chunks: Buffer[] = [];
  let exit: ExecExit | undefined;
  let note = "";
  for await (const m of sandbox.exec({
    sessionId,
    command,
    timeoutMs: opts.timeoutMs ?? 20_000,
    stdin: opts.stdin,
    agentId: opts.agentId,
    egress: opts.egress,
  })) {
    if (m.kind.case === "stdout" || m.kind.case === "stderr") chunks.push(Buffer.from(m.kind.value));
    if (m.kind.case === "exit") exit = m.kind.value;
    if (m.kind.case === "started") note = m.kind.value.workspaceNote;
  }
  if (!exit) throw new Error(`${command}: the stream ended without an exit status`);
  const all = Buffer.concat(chunks);
  return { out: all.toString("utf8"), bytes: all.length, exit, note };
}

/** Asserts the call fails with `code`, and returns its message. */
export async function failsWith(call: Promise<unknown>, code: Status): Promise<string> {
  let details = "";
  await assert.rejects(call, (e: { code: number; details: string }) => {
    assert.equal(e.code, code, `${Status[e.code]}: ${e.details}`);
    details = e.details;
    return true;
  });
  return details;
}

/** Waits for a save of session `id`'s workspace (workspace-saves.ts) made after `since` (ms); its record. */
export async function savedAfter(
  dataDir: string,
  id: string,
  since: number,
  owner = DEV_IDENTITY,
): Promise<{ bytes: number; refused?: string }> {
  const key = scopeKey("session", owner, id, "");
  const dir = path.join(dataDir, "workspaces");
  return waitFor(
    `a save of ${id}`,
    async () => {
      for (const f of (await readdir(dir).catch(() => [])).filter((x) => x.endsWith(".json"))) {
        const meta = JSON.parse(await readFile(path.join(dir, f), "utf8").catch(() => "{}"));
        if (meta.key === key && meta.savedAt > since) return meta as { bytes: number; refused?: string };
      }
      return undefined;
    },
    20_000,
    100,
  );
}
