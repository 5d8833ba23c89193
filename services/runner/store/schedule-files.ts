// Where schedules are kept: the ScheduleStore contract (the file store here is the embedded
// default; schedules.ts holds what they mean). Each session's schedules are one record, named by the
// session's ref (tenant, principal, id; see session-ref.ts), keeping the raw ids; a record read
// under another ref's name counts as none, so a schedule fires only into the session of the
// principal that made it.
import { mkdir, readFile, readdir, rename, rm } from "node:fs/promises";
import path from "node:path";
import { replaceFile } from "../../shared/exclusive-file.js";
import { fileName, sameRef, type SessionRef } from "../../shared/session-ref.js";

export interface StoredSchedule {
  scheduleId: string;
  cron?: string;
  /** IANA time zone of the cron expression; absent: UTC. */
  timeZone?: string;
  everySeconds?: number;
  text: string;
  createdMs: number;
  lastFireMs?: number;
  /** The frame of the message in whose run an agent made it (manage_schedule). */
  originFrameId?: string;
}

export interface ScheduleFile {
  sessionId: string;
  tenant: string;
  principal: string;
  schedules: StoredSchedule[];
}

/** The schedules of every session, stored. Writes to one session are never concurrent (ScheduleBook serialises them). */
export interface ScheduleStore {
  /** The session's schedules; a damaged record, or one of another session, counts as none. May reject (I/O). */
  read(ref: SessionRef): Promise<ScheduleFile | undefined>;
  /** Every session's schedules (damaged records skipped). May reject (I/O). */
  all(): Promise<ScheduleFile[]>;
  /** Replaces the session's schedules, whole; undefined removes them. May reject (I/O). */
  write(ref: SessionRef, file: ScheduleFile | undefined): Promise<void>;
}

export const refOfFile = (f: ScheduleFile): SessionRef => ({
  tenant: f.tenant,
  principal: f.principal,
  sessionId: f.sessionId,
});

/** A schedule file's text as a file, or undefined when it is empty, torn or not one. */
export function parseScheduleFile(text: string): ScheduleFile | undefined {
  try {
    const f = JSON.parse(text) as ScheduleFile;
    const ok =
      typeof f?.sessionId === "string" &&
      typeof f.tenant === "string" &&
      typeof f.principal === "string" &&
      Array.isArray(f.schedules);
    return ok ? f : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Schedules as files: one per session under `dir`, named by its ref and written whole (fsynced,
 * renamed into place). A file keeps the raw ids and counts only under its own name.
 */
export class FileScheduleStore implements ScheduleStore {
  constructor(
    readonly dir: string,
    /** Told about a file that is not a schedule file (empty, torn, edited by hand); it is skipped. Never throws. */
    private readonly onDamaged: (file: string) => void = () => undefined,
  ) {}

  private file(ref: SessionRef): string {
    return path.join(this.dir, `${fileName(ref.tenant, ref.principal, ref.sessionId)}.json`);
  }

  /** The session's schedules; a file that names another session, or is damaged, counts as none. */
  async read(ref: SessionRef): Promise<ScheduleFile | undefined> {
    const file = this.file(ref);
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
    const parsed = parseScheduleFile(text);
    if (!parsed) this.onDamaged(file);
    return parsed && sameRef(refOfFile(parsed), ref) ? parsed : undefined;
  }

  async all(): Promise<ScheduleFile[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const out: ScheduleFile[] = [];
    for (const n of names.filter((n) => n.endsWith(".json"))) {
      const file = path.join(this.dir, n);
      const parsed = parseScheduleFile(await readFile(file, "utf8").catch(() => ""));
      // Only a file under its own name counts, so no file can speak for another session.
      if (parsed && this.file(refOfFile(parsed)) === file) out.push(parsed);
      else if (!parsed) this.onDamaged(file);
    }
    return out;
  }

  /**
   * Files written before schedules were named by ref (`<session>.json`) move to their ref's name,
   * once, at start; a damaged one stays where it is and is reported.
   */
  async migrate(): Promise<void> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    for (const n of names.filter((n) => n.endsWith(".json"))) {
      const file = path.join(this.dir, n);
      const parsed = parseScheduleFile(await readFile(file, "utf8").catch(() => ""));
      if (!parsed) this.onDamaged(file);
      else if (this.file(refOfFile(parsed)) !== file && !(await this.read(refOfFile(parsed))))
        await rename(file, this.file(refOfFile(parsed)));
    }
  }

  async write(ref: SessionRef, file: ScheduleFile | undefined): Promise<void> {
    const target = this.file(ref);
    if (!file) return void (await rm(target, { force: true }));
    await mkdir(this.dir, { recursive: true });
    await replaceFile(target, JSON.stringify(file, null, 1));
  }
}
