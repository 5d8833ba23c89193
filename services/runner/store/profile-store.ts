// An owner's profile (USER.md): what the agent keeps about the person it works for, one per
// agent, tenant and principal. It is user data, kept with the runner's other state (not with the
// operator's agent files), and made from a template the first time a run asks for it.
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { filePart } from "../../shared/session-ref.js";
import { type FileRead, readContextFile } from "../loop/context-file.js";

/** Whose profile: an agent's owner in one tenant. */
export interface ProfileOwner {
  agentId: string;
  tenant: string;
  principal: string;
}

export interface ProfileStore {
  /**
   * The profile, made from `template` if there is none yet (two runs asking at once make it
   * once), read as a context file is: cut at `limit` characters, with the problem said.
   * Contract: rejects only when the store cannot be read or written.
   */
  read(owner: ProfileOwner, template: string, limit: number): Promise<FileRead | undefined>;
}

/** Profiles as files: `<dir>/<agent>/<tenant>/<principal>/USER.md`, each part as filePart encodes it. */
export class FileProfileStore implements ProfileStore {
  constructor(readonly dir: string) {}

  async read(owner: ProfileOwner, template: string, limit: number): Promise<FileRead | undefined> {
    const dir = path.join(this.dir, filePart(owner.agentId), filePart(owner.tenant), filePart(owner.principal));
    const file = path.join(dir, "USER.md");
    await mkdir(dir, { recursive: true });
    await writeFile(file, template, { flag: "wx" }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "EEXIST") throw err;
    });
    return readContextFile(file, limit);
  }
}

/** Profiles in this process (the in-process tests); `set` stands for an owner's edit. */
export class InMemoryProfileStore implements ProfileStore {
  private readonly texts = new Map<string, string>();
  private key = (o: ProfileOwner) => JSON.stringify([o.agentId, o.tenant, o.principal]);

  async read(owner: ProfileOwner, template: string, limit: number): Promise<FileRead> {
    const key = this.key(owner);
    if (!this.texts.has(key)) this.texts.set(key, template);
    return profileRead(owner, this.texts.get(key)!, limit);
  }

  set(owner: ProfileOwner, text: string): void {
    this.texts.set(this.key(owner), text);
  }
}

/** A stored profile's text as a context file, cut at `limit` with the problem said. */
export function profileRead(owner: ProfileOwner, text: string, limit: number): FileRead {
  const file = `profile ${owner.agentId}/${owner.tenant}/${owner.principal}`;
  if (text.length <= limit) return { file, text };
  return {
    file,
    text: text.slice(0, limit),
    problem: `USER.md has ${text.length} characters; only the first ${limit} are used`,
  };
}
