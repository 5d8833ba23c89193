// Agents' workspace templates: the image an agent's sandboxes run and the files a new workspace
// of it starts with, as the runner puts them from agent.json's `workspace`. Kept in the service's
// data directory (`templates/<agent>.json`, the files as `templates/files/<sha256>.tar`) and in
// memory, since every command looks its agent's template up. An image must be the service's own
// or one the operator allows (TROUPE_SANDBOX_IMAGES): agents cannot bring an arbitrary image.
// The files are the operator's, the same for every tenant, so a pooled sandbox may carry them.
import { createHash } from "node:crypto";
import { mkdir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import { failedPrecondition, invalidArgumentIf } from "../../shared/errors.js";
import { isAgentId } from "../../shared/ids.js";
import type { Logger } from "../../shared/process/log.js";
import { fileName } from "../../shared/session-ref.js";
import { readRecord, unpackWorkspace, writeRecord, writeWhole } from "./workspace-archive.js";
import type { KeptWorkspace } from "./workspace-saves.js";
import { isSnapshotId } from "./snapshots.js";

/** What a new sandbox of an agent is made from. */
export interface WorkspaceStart {
  agentId: string;
  image: string;
  /** The archive of the files a workspace starts with; absent: it starts empty. */
  files?: string;
  /** Instead: a snapshot, and its archive in the session's tenant (undefined: the tenant has none). */
  snapshot?: { id: string; file(): Promise<string | undefined> };
}

interface Template {
  agentId: string;
  image: string;
  sha256: string;
  bytes: number;
  snapshotId?: string;
}

const SHA256 = /^[0-9a-f]{64}$/;

export class AgentTemplates {
  private readonly byAgent = new Map<string, Template>();
  private readonly allowed: Set<string>;

  constructor(
    private readonly dir: string,
    private readonly defaultImage: string,
    allowedImages: readonly string[],
    /** The largest archive of files taken. */
    private readonly maxBytes: number,
    private readonly logger: Logger,
  ) {
    this.allowed = new Set([defaultImage, ...allowedImages]);
  }

  /** Every image a sandbox of this service may run. */
  get images(): string[] {
    return [...this.allowed];
  }

  /** Reads the templates kept on disk; call once before serving. */
  async load(): Promise<void> {
    for (const name of await readdir(this.dir).catch(() => [] as string[])) {
      if (!name.endsWith(".json")) continue;
      const t = await readRecord<Template>(path.join(this.dir, name));
      if (!t) continue;
      // An image no longer allowed is not used: the agent's sandboxes fall back to the default.
      if (this.allowed.has(t.image)) this.byAgent.set(t.agentId, t);
      else
        this.logger.warn("a template's image is no longer allowed; ignoring it", { agent: t.agentId, image: t.image });
    }
  }

  /**
   * What a new sandbox of the agent is made from; the default image with no files when it has no
   * template. `snapshotFile` finds a snapshot template's archive in the session's tenant.
   */
  of(agentId: string, snapshotFile: (id: string) => Promise<string | undefined>): WorkspaceStart {
    const t = this.byAgent.get(agentId);
    if (!t) return { agentId, image: this.defaultImage };
    const id = t.snapshotId;
    return {
      agentId,
      image: t.image,
      files: t.sha256 ? this.filesPath(t.sha256) : undefined,
      snapshot: id ? { id, file: () => snapshotFile(id) } : undefined,
    };
  }

  /** The images templates name now (the warm pool keeps sandboxes of each). */
  usedImages(): Set<string> {
    return new Set([this.defaultImage, ...[...this.byAgent.values()].map((t) => t.image)]);
  }

  private filesPath(sha256: string): string {
    return path.join(this.dir, "files", `${sha256}.tar`);
  }

  /** Sets the agent's template (an empty one removes it); whether it changed. */
  async put(agentId: string, image: string, files: Uint8Array, sha256: string, snapshotId = ""): Promise<boolean> {
    invalidArgumentIf(!isAgentId(agentId), "agent_id is missing or malformed");
    invalidArgumentIf(snapshotId !== "" && !isSnapshotId(snapshotId), "snapshot_id is malformed");
    invalidArgumentIf(snapshotId !== "" && files.length > 0, "a template has files or a snapshot, not both");
    invalidArgumentIf(files.length > this.maxBytes, `files must be an archive of at most ${this.maxBytes} bytes`);
    const chosen = image || this.defaultImage;
    if (!this.allowed.has(chosen))
      throw failedPrecondition(
        `image ${chosen.slice(0, 200)} is not one this sandbox service runs: add it to TROUPE_SANDBOX_IMAGES (it must hold troupe-agent)`,
      );
    const digest = files.length > 0 ? createHash("sha256").update(files).digest("hex") : "";
    invalidArgumentIf(
      files.length > 0 && (!SHA256.test(sha256) || digest !== sha256),
      "files_sha256 is not the SHA-256 of files",
    );
    const before = this.byAgent.get(agentId);
    const record = path.join(this.dir, `${fileName(agentId)}.json`);
    if (chosen === this.defaultImage && digest === "" && snapshotId === "") {
      if (!before) return false;
      this.byAgent.delete(agentId);
      await rm(record, { force: true });
      await this.dropUnused(before.sha256);
      this.logger.info("removed an agent's workspace template", { agent: agentId });
      return true;
    }
    if (before && before.image === chosen && before.sha256 === digest && (before.snapshotId ?? "") === snapshotId)
      return false;
    await mkdir(path.join(this.dir, "files"), { recursive: true, mode: 0o700 });
    if (digest) await writeWhole(this.filesPath(digest), files);
    const t: Template = {
      agentId,
      image: chosen,
      sha256: digest,
      bytes: files.length,
      snapshotId: snapshotId || undefined,
    };
    await writeRecord(record, t);
    this.byAgent.set(agentId, t);
    if (before) await this.dropUnused(before.sha256);
    this.logger.info("set an agent's workspace template", { agent: agentId, image: chosen, bytes: files.length });
    return true;
  }

  /** Removes an archive of files no template names any more. */
  private async dropUnused(sha256: string): Promise<void> {
    if (!sha256 || [...this.byAgent.values()].some((t) => t.sha256 === sha256)) return;
    await rm(this.filesPath(sha256), { force: true });
  }
}

/** Unpacks a template's files or snapshot (if it has either) into a new sandbox's workspace, and notes what it starts with. */
export async function startFromTemplate(w: KeptWorkspace, start: WorkspaceStart, logger: Logger): Promise<void> {
  const from = start.snapshot
    ? `snapshot ${start.snapshot.id} (agent ${start.agentId}'s template)`
    : `the files of agent ${start.agentId}'s template`;
  try {
    const file = start.snapshot ? await start.snapshot.file() : start.files;
    if (!file) {
      if (start.snapshot)
        w.note = `this sandbox is new and /workspace starts empty: agent ${start.agentId}'s template names snapshot ${start.snapshot.id}, which this session's tenant does not hold`;
      return;
    }
    await unpackWorkspace(w.agent, file);
    w.note = `this sandbox is new: /workspace starts with ${from}`;
  } catch (err) {
    logger.warn("could not unpack a template", { scope: w.key, error: (err as Error).message });
    w.note = `this sandbox is new and /workspace starts empty: ${from} could not be read or unpacked (${(err as Error).message})`;
  }
}
