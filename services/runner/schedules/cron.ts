// Five-field cron expressions (minute hour day-of-month month day-of-week) in a time zone,
// parsed and stepped by croner, which handles IANA time zones and daylight saving time:
//
//   *  any     5  one value     1,15  a list     1-5  a range     */10, 5-50/15  steps
//   month names jan..dec, weekday names sun..sat; 0 and 7 are both Sunday; L, W and # as croner has them
//
// As in Vixie cron, when both day fields are restricted a day matches if either does; a fixed
// time that a DST change skips fires right after the gap, and one that happens twice fires once.
import type { Cron as CronJob } from "croner";
import { lazyModule } from "../../shared/process/lazy-module.js";

export class CronError extends Error {}

/** Loaded with the first schedule: a runner with none does not carry it. */
const croner = lazyModule<typeof import("croner")>("croner");

export interface Cron {
  readonly source: string;
  /** IANA name; "UTC" unless the schedule named one. */
  readonly timeZone: string;
  readonly job: CronJob;
}

/** The name, if the runtime knows it as a time zone (Intl's list); a CronError saying it is not. */
export function checkTimeZone(timeZone: string): string {
  try {
    // Kept as given: ICU would turn Asia/Kolkata into its old name, Asia/Calcutta.
    new Intl.DateTimeFormat("en-US", { timeZone });
    return timeZone;
  } catch {
    throw new CronError(
      `${JSON.stringify(timeZone.slice(0, 64))} is not a time zone (IANA names such as Europe/Berlin)`,
    );
  }
}

const FIELDS: readonly [string, number, number][] = [
  ["minute", 0, 59],
  ["hour", 0, 23],
  ["day of month", 1, 31],
  ["month", 1, 12],
  ["day of week", 0, 7],
];

/** Plain numbers outside their field's range, said in the field's terms (croner's words are its internals'). */
function checkNumbers(fields: string[]): void {
  fields.forEach((field, i) => {
    const [name, min, max] = FIELDS[i];
    for (const n of field.split(/[,-]/).map((part) => part.split("/")[0]))
      if (/^\d+$/.test(n) && (Number(n) < min || Number(n) > max))
        throw new CronError(`${name}: ${Number(n)} is outside ${min}-${max}`);
  });
}

export function parseCron(expression: string, timeZone = "UTC"): Cron {
  const source = expression.trim();
  const fields = source.split(/\s+/);
  if (expression.length > 200 || fields.length !== 5 || fields[0] === "")
    throw new CronError(
      `a cron expression has 5 fields (minute hour day-of-month month day-of-week); ${JSON.stringify(expression.slice(0, 100))} has ${fields[0] === "" ? 0 : fields.length}`,
    );
  checkNumbers(fields);
  const zone = checkTimeZone(timeZone || "UTC");
  let job: CronJob;
  try {
    job = new (croner().Cron)(source, {
      timezone: zone,
      mode: "5-part",
      domAndDow: false,
      fixedTimeRule: "no-wildcard",
      paused: true,
    });
  } catch (err) {
    throw new CronError((err as Error).message.replace(/^CronPattern: /, ""));
  }
  const cron = { source, timeZone: zone, job };
  // An expression that can never fire (31 February) is a mistake worth reporting now.
  if (nextFire(cron, Date.now()) === undefined) throw new CronError(`${JSON.stringify(source)} never fires`);
  return cron;
}

/** The first fire time strictly after `afterMs` (undefined if none). */
export function nextFire(c: Cron, afterMs: number): number | undefined {
  return c.job.nextRun(new Date(afterMs))?.getTime() ?? undefined;
}
