// Agents' workspace templates (agent.json `workspace`), put to the sandbox service, which makes
// the agent's new sandboxes from them (sandbox/workspaces/templates.ts): the image, and the files
// of a folder of the agent's, sent as a tar archive. Put once per agent.json as loaded
// (AgentConfigs hands out one config object until the file changes), again after a failure, and
// again every REPUT_MS (a sandbox service that lost its data directory gets it back); an agent
// without `workspace` puts an empty template, which removes one an earlier agent.json set. That
// empty put is housekeeping: after a failure it is tried again RETRY_EMPTY_MS later, not on every
// run, so a runner without a sandbox service does not pay a failed call and an error line a run.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import path from "node:path";
import type { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { Logger } from "../../shared/process/log.js";
import type { ServiceClient } from "../../shared/rpc.js";
import type { AgentConfig } from "../agent-config.js";

const PUT_TIMEOUT_MS = 5_000;
const REPUT_MS = 5 * 60_000;
const RETRY_EMPTY_MS = 30_000;

/** The files of `dir` as a tar archive (ustar: busybox's tar and GNU's both read it), at most `maxBytes`. */
function archiveOf(dir: string, maxBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    execFile(
      "tar",
      ["--format=ustar", "--numeric-owner", "--owner=0", "--group=0", "-C", dir, "-cf", "-", "."],
      { encoding: "buffer", maxBuffer: maxBytes },
      (err, stdout, stderr) => {
        if (err)
          reject(
            new Error(
              (err as { code?: string }).code === "ERR_CHILD_PROCESS_STDIO_MAXBUFFER"
                ? `its files are over ${maxBytes} bytes as an archive`
                : stderr.toString("utf8").trim() || err.message,
            ),
          );
        else resolve(stdout);
      },
    );
  });
}

export class WorkspaceTemplates {
  private readonly put = new WeakMap<AgentConfig, { at: number; done: Promise<void> }>();

  constructor(
    private readonly sandbox: ServiceClient<(typeof SandboxService)["method"]>,
    private readonly logger: Logger,
    /** The largest archive of files sent (under the gRPC message size). */
    private readonly maxBytes: number,
  ) {}

  /**
   * Resolves once the sandbox service holds the template `agent` describes. Never rejects: a
   * failure is logged and the next run tries again. An agent with a template waits for the put
   * (its sandboxes must start from it); one without does not.
   */
  ensure(agentId: string, agent: AgentConfig, agentDir: string): Promise<void> {
    let entry = this.put.get(agent);
    if (!entry || Date.now() - entry.at > REPUT_MS) {
      const fresh = { at: Date.now(), done: Promise.resolve() };
      fresh.done = this.send(agentId, agent, agentDir).catch((err: unknown) => {
        // A template the agent's sandboxes must start from is tried again by the next run.
        if (agent.workspace) this.put.delete(agent);
        else fresh.at = Date.now() - REPUT_MS + RETRY_EMPTY_MS;
        this.logger.error("could not set the agent's workspace template in the sandbox service", {
          agent: agentId,
          error: (err as Error).message,
        });
      });
      entry = fresh;
      this.put.set(agent, entry);
    }
    return agent.workspace ? entry.done : Promise.resolve();
  }

  private async send(agentId: string, agent: AgentConfig, agentDir: string): Promise<void> {
    const { image = "", files: folder, snapshot: snapshotId = "" } = agent.workspace ?? {};
    let files: Buffer = Buffer.alloc(0);
    if (folder) {
      const dir = path.resolve(agentDir, folder);
      // The schema refuses `..` and absolute paths; this is the check that holds regardless.
      if (!dir.startsWith(path.resolve(agentDir) + path.sep))
        throw new Error(`workspace.files ${folder} leaves the agent's folder`);
      files = await archiveOf(dir, this.maxBytes).catch((err: Error) => {
        throw new Error(`workspace.files ${folder}: ${err.message}`);
      });
    }
    const filesSha256 = files.length > 0 ? createHash("sha256").update(files).digest("hex") : "";
    const { changed } = await this.sandbox.putTemplate(
      { agentId, image, files, filesSha256, snapshotId },
      { timeoutMs: PUT_TIMEOUT_MS },
    );
    if (changed) this.logger.info("set the agent's workspace template", { agent: agentId, image, bytes: files.length });
  }
}
