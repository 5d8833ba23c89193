// Triggers beyond chat: scheduled tasks (cron) and heartbeats. Each session's schedules are one
// JSON file under <data-dir>/schedules/, named by the session's ref (tenant, principal, id; see
// session-ref.ts), written whole, fsynced and renamed into place, so a schedule survives any
// restart and every runner sharing the data directory sees it. The file keeps the raw ids and a
// read compares them: a schedule fires only into the session of the principal that made it.
//
// Every runner runs a Scheduler over all the files. A firing submits a prompt whose frame id is
// made of the schedule and the due time ("trigger:schedule:<id>:<ms>"): the session takes it once
// even if two runners fire it, and only the runner that holds (or wins) the session's lease can
// submit at all. A runner that was down when a firing was due fires it once when it comes back.
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { invalidArgument, resourceExhausted } from "../../shared/errors.js";
import { ScheduleSchema, type Schedule } from "../../shared/gen/troupe/v1/schedule_pb.js";
import { newId } from "../../shared/ids.js";
import type { Logger } from "../../shared/process/log.js";
import { refKey, type SessionRef } from "../../shared/session-ref.js";
import { refOfFile, type ScheduleFile, type ScheduleStore, type StoredSchedule } from "../store/schedule-files.js";
import { CronError, nextFire, parseCron, type Cron } from "./cron.js";

const SCHEDULE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
export const DEFAULT_HEARTBEAT_TEXT =
  "Heartbeat: check whether anything needs your attention. If nothing does, reply HEARTBEAT_OK.";

/** A schedule as the caller sent it, checked: INVALID_ARGUMENT says what is wrong. */
function validate(s: Schedule, minEverySeconds: number): StoredSchedule {
  const scheduleId = s.scheduleId || `s-${newId().slice(0, 12)}`;
  if (!SCHEDULE_ID.test(scheduleId))
    throw invalidArgument("schedule_id must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit)");
  if (s.text.length > 8000) throw invalidArgument("text must be at most 8000 characters");
  const base = { scheduleId, text: s.text, createdMs: Date.now() };
  switch (s.when.case) {
    case "cron": {
      let cron: Cron;
      try {
        cron = parseCron(s.when.value, s.timeZone || "UTC");
      } catch (err) {
        if (err instanceof CronError)
          throw invalidArgument(`${/time zone/.test(err.message) ? "time_zone" : "cron"}: ${err.message}`);
        throw err;
      }
      if (s.text.trim() === "")
        throw invalidArgument("text is required for a cron schedule: it is the message the task's turn starts with");
      return { ...base, cron: cron.source, ...(cron.timeZone !== "UTC" ? { timeZone: cron.timeZone } : {}) };
    }
    case "everySeconds":
      if (s.timeZone !== "") throw invalidArgument("time_zone is for cron schedules; every_seconds counts real time");
      if (s.when.value < minEverySeconds) throw invalidArgument(`every_seconds must be at least ${minEverySeconds}`);
      return { ...base, everySeconds: s.when.value };
    default:
      throw invalidArgument("a schedule needs cron or every_seconds");
  }
}

/** When a stored schedule fires next, after its last firing (or its creation). */
function dueAfter(s: StoredSchedule, cron: Cron | undefined, fromMs: number): number | undefined {
  if (cron) return nextFire(cron, fromMs);
  return fromMs + (s.everySeconds ?? 0) * 1000;
}

function toProto(sessionId: string, s: StoredSchedule): Schedule {
  const cron = s.cron ? parseCron(s.cron, s.timeZone) : undefined;
  const next = dueAfter(s, cron, s.lastFireMs ?? s.createdMs);
  return create(ScheduleSchema, {
    scheduleId: s.scheduleId,
    sessionId,
    when: s.cron ? { case: "cron", value: s.cron } : { case: "everySeconds", value: s.everySeconds ?? 0 },
    text: s.text,
    createTime: timestampFromMs(s.createdMs),
    nextFireTime: next === undefined ? undefined : timestampFromMs(next),
    lastFireTime: s.lastFireMs === undefined ? undefined : timestampFromMs(s.lastFireMs),
    timeZone: s.timeZone ?? "",
    originFrameId: s.originFrameId ?? "",
  });
}

/**
 * The schedules of every session: checked, listed, changed one session at a time (changes to one
 * session's schedules are serialised in this process), kept in a ScheduleStore (schedule-files.ts).
 */
export class ScheduleBook {
  private readonly chains = new Map<string, Promise<unknown>>();

  constructor(
    readonly store: ScheduleStore,
    private readonly minEverySeconds = 10,
  ) {}

  /** The session's schedules (none: undefined). */
  read(ref: SessionRef): Promise<ScheduleFile | undefined> {
    return this.store.read(ref);
  }

  /** Every session's schedules. */
  all(): Promise<ScheduleFile[]> {
    return this.store.all();
  }

  private update<T>(
    ref: SessionRef,
    change: (file: ScheduleFile | undefined) => { file: ScheduleFile | undefined; result: T },
  ): Promise<T> {
    const target = refKey(ref);
    const prev = this.chains.get(target) ?? Promise.resolve();
    const next = prev
      .catch(() => undefined)
      .then(async () => {
        const { file, result } = change(await this.store.read(ref));
        await this.store.write(ref, file && file.schedules.length > 0 ? file : undefined);
        return result;
      });
    this.chains.set(target, next);
    void next.finally(() => this.chains.get(target) === next && this.chains.delete(target)).catch(() => undefined);
    return next;
  }

  list(file: ScheduleFile | undefined): Schedule[] {
    return (file?.schedules ?? []).map((s) => toProto(file!.sessionId, s));
  }

  /**
   * Adds or replaces (same id) a schedule of the session, which may hold at most `max`. `origin`:
   * the frame of the message in whose run an agent makes it (never the caller's to say).
   */
  put(ref: SessionRef, schedule: Schedule, max: number, origin = ""): Promise<Schedule> {
    return this.update(ref, (file) => {
      const others = (file?.schedules ?? []).filter(
        (s) => s.scheduleId !== schedule.scheduleId || schedule.scheduleId === "",
      );
      const stored = { ...validate(schedule, this.minEverySeconds), ...(origin ? { originFrameId: origin } : {}) };
      if (others.length >= max)
        throw resourceExhausted(`a session holds at most ${max} schedules (quota schedulesPerSession)`);
      const next: ScheduleFile = {
        sessionId: ref.sessionId,
        tenant: ref.tenant,
        principal: ref.principal,
        schedules: [...others, stored],
      };
      return { file: next, result: toProto(ref.sessionId, stored) };
    });
  }

  remove(ref: SessionRef, scheduleId: string): Promise<boolean> {
    return this.update(ref, (file) => {
      const kept = (file?.schedules ?? []).filter((s) => s.scheduleId !== scheduleId);
      const removed = kept.length !== (file?.schedules.length ?? 0);
      return { file: file && { ...file, schedules: kept }, result: removed };
    });
  }

  markFired(ref: SessionRef, scheduleId: string, atMs: number): Promise<void> {
    return this.update(ref, (file) => {
      const s = file?.schedules.find((x) => x.scheduleId === scheduleId);
      if (s) s.lastFireMs = Math.max(s.lastFireMs ?? 0, atMs);
      return { file, result: undefined };
    });
  }
}

/** One firing: the session (as its owner names it), the schedule and the time it was due. */
export interface Firing {
  ref: SessionRef;
  scheduleId: string;
  kind: "schedule" | "heartbeat";
  dueMs: number;
  /** The message the turn starts with, trigger stated first. */
  text: string;
}

/** The turn's first message: what triggered it, then the schedule's text. */
export function triggerText(s: StoredSchedule, dueMs: number): string {
  const at = new Date(dueMs).toISOString();
  if (s.cron)
    return `[Scheduled task ${s.scheduleId} (cron "${s.cron}", ${s.timeZone ?? "UTC"}) fired at ${at}. This turn was not started by the user.]\n${s.text}`;
  return `[Heartbeat ${s.scheduleId} (every ${s.everySeconds} s) at ${at}. This turn was not started by the user.]\n${s.text || DEFAULT_HEARTBEAT_TEXT}`;
}

/** Fires due schedules of every session in the data directory. */
export class Scheduler {
  private timer?: NodeJS.Timeout;
  private lastScan = 0;
  /** Every schedule of the last scan, its cron expression parsed once. */
  private entries: { file: ScheduleFile; schedule: StoredSchedule; cron?: Cron }[] = [];
  private firing = new Set<string>();
  /** Schedules that did not fire here (another runner owns the session): not tried again before this time. */
  private notBefore = new Map<string, number>();
  private stopped = false;

  constructor(
    private readonly book: ScheduleBook,
    private readonly fire: (f: Firing) => Promise<void>,
    private readonly logger: Logger,
    private readonly options = { tickMs: 1000, rescanMs: 5000, retryMs: 15_000 },
  ) {}

  start(): void {
    const tick = () => {
      this.tick()
        .catch((err: unknown) => this.logger.warn("scheduler tick failed", { error: String(err) }))
        .finally(() => {
          if (!this.stopped) this.timer = setTimeout(tick, this.options.tickMs);
        });
    };
    tick();
  }

  /** A session's schedules changed here: read them again at the next tick. */
  changed(): void {
    this.lastScan = 0;
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  private async tick(): Promise<void> {
    const now = Date.now();
    if (now - this.lastScan >= this.options.rescanMs) {
      this.entries = (await this.book.all()).flatMap((file) =>
        file.schedules.map((schedule) => ({
          file,
          schedule,
          cron: schedule.cron ? parseCron(schedule.cron, schedule.timeZone) : undefined,
        })),
      );
      this.lastScan = now;
    }
    for (const { file, schedule: s, cron } of this.entries) {
      const ref = refOfFile(file);
      const key = `${refKey(ref)}\u0000${s.scheduleId}`;
      if (this.firing.has(key) || (this.notBefore.get(key) ?? 0) > now) continue;
      const due = dueAfter(s, cron, s.lastFireMs ?? s.createdMs);
      if (due === undefined || due > now) continue;
      this.firing.add(key);
      // Several missed firings (the runner was down) become one: the latest due time counts.
      const every = (s.everySeconds ?? 1) * 1000;
      const dueMs = cron ? latestDue(cron, due, now) : due + Math.floor((now - due) / every) * every;
      const firing: Firing = {
        ref,
        scheduleId: s.scheduleId,
        kind: cron ? "schedule" : "heartbeat",
        dueMs,
        text: triggerText(s, dueMs),
      };
      this.fire(firing)
        .then(() => this.book.markFired(ref, s.scheduleId, dueMs))
        .then(() => {
          s.lastFireMs = dueMs;
          this.notBefore.delete(key);
        })
        .catch((err: unknown) => {
          // The runner that owns the session fires it; if that one is gone, this one tries again later.
          this.notBefore.set(key, Date.now() + this.options.retryMs);
          this.logger.debug("schedule not fired here", {
            session: ref.sessionId,
            schedule: s.scheduleId,
            error: String((err as Error).message ?? err),
          });
        })
        .finally(() => this.firing.delete(key));
    }
  }
}

/** The last fire time of `cron` at or before `now`, starting from `from` (itself due). */
function latestDue(cron: Cron, from: number, now: number): number {
  let last = from;
  for (let t = nextFire(cron, from), n = 0; t !== undefined && t <= now && n < 100_000; t = nextFire(cron, t), n++)
    last = t;
  return last;
}

/**
 * The frame a triggered run answers: the origin of the schedule that fired it (`trigger` as
 * AgentStart names it, "schedule:<id>" or "heartbeat:<id>"); "" when there is none or it is gone.
 */
export async function originOf(book: ScheduleBook, ref: SessionRef, trigger: string): Promise<string> {
  const id = trigger.slice(trigger.indexOf(":") + 1);
  if (!trigger || !id) return "";
  const file = await book.read(ref).catch(() => undefined);
  return file?.schedules.find((s) => s.scheduleId === id)?.originFrameId ?? "";
}
