// Five-field cron expressions (minute hour day-of-month month day-of-week), in UTC.
//
//   *  any     5  one value     1,15  a list     1-5  a range     */10, 5-50/15  steps
//   month names jan..dec, weekday names sun..sat; 0 and 7 are both Sunday
//
// As in Vixie cron, when both day fields are restricted a day matches if either does.
export class CronError extends Error {}

interface Field {
  name: string;
  min: number;
  max: number;
  names?: readonly string[];
}

const FIELDS: readonly Field[] = [
  { name: "minute", min: 0, max: 59 },
  { name: "hour", min: 0, max: 23 },
  { name: "day of month", min: 1, max: 31 },
  {
    name: "month",
    min: 1,
    max: 12,
    names: ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
  },
  { name: "day of week", min: 0, max: 7, names: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"] },
];

export interface Cron {
  readonly source: string;
  minutes: Set<number>;
  hours: Set<number>;
  days: Set<number>;
  months: Set<number>;
  weekdays: Set<number>;
  daysRestricted: boolean;
  weekdaysRestricted: boolean;
}

function value(text: string, f: Field): number {
  const named = f.names?.indexOf(text.toLowerCase()) ?? -1;
  if (named >= 0) return named + (f.min === 1 ? 1 : 0);
  if (!/^\d{1,2}$/.test(text))
    throw new CronError(`${f.name}: ${JSON.stringify(text)} is not a number${f.names ? " or a name" : ""}`);
  const n = Number(text);
  if (n < f.min || n > f.max) throw new CronError(`${f.name}: ${n} is outside ${f.min}-${f.max}`);
  return n;
}

function parseField(text: string, f: Field): Set<number> {
  const out = new Set<number>();
  for (const part of text.split(",")) {
    const m = /^([^/]+)(?:\/(\d{1,2}))?$/.exec(part);
    if (!m) throw new CronError(`${f.name}: ${JSON.stringify(part)} is not a value, range or step`);
    const step = m[2] === undefined ? 1 : Number(m[2]);
    if (step < 1) throw new CronError(`${f.name}: a step must be at least 1`);
    let lo: number;
    let hi: number;
    if (m[1] === "*") [lo, hi] = [f.min, f.max];
    else if (m[1].includes("-")) {
      const [a, b, ...rest] = m[1].split("-");
      if (rest.length > 0 || a === "" || b === "")
        throw new CronError(`${f.name}: ${JSON.stringify(m[1])} is not a range`);
      [lo, hi] = [value(a, f), value(b, f)];
      if (lo > hi) throw new CronError(`${f.name}: the range ${m[1]} runs backwards`);
    } else {
      lo = value(m[1], f);
      hi = m[2] === undefined ? lo : f.max;
    }
    for (let v = lo; v <= hi; v += step) out.add(v);
  }
  return out;
}

export function parseCron(expression: string): Cron {
  const parts = expression.trim().split(/\s+/);
  if (expression.length > 200 || parts.length !== 5 || parts[0] === "") {
    throw new CronError(
      `a cron expression has 5 fields (minute hour day-of-month month day-of-week); ${JSON.stringify(expression.slice(0, 100))} has ${parts[0] === "" ? 0 : parts.length}`,
    );
  }
  const [minutes, hours, days, months, weekdays] = parts.map((p, i) => parseField(p, FIELDS[i]));
  if (weekdays.delete(7)) weekdays.add(0);
  const cron: Cron = {
    source: expression.trim(),
    minutes,
    hours,
    days,
    months,
    weekdays,
    daysRestricted: parts[2] !== "*",
    weekdaysRestricted: parts[4] !== "*",
  };
  // An expression that can never fire (31 February) is a mistake worth reporting now.
  if (nextFire(cron, Date.UTC(2000, 0, 1)) === undefined)
    throw new CronError(`${JSON.stringify(expression)} never fires`);
  return cron;
}

function dayMatches(c: Cron, d: Date): boolean {
  const dom = c.days.has(d.getUTCDate());
  const dow = c.weekdays.has(d.getUTCDay());
  if (c.daysRestricted && c.weekdaysRestricted) return dom || dow;
  return dom && dow;
}

/** The first fire time strictly after `afterMs` (undefined if none within 5 years). */
export function nextFire(c: Cron, afterMs: number): number | undefined {
  const t = new Date(Math.floor(afterMs / 60_000) * 60_000 + 60_000);
  const limit = afterMs + 5 * 366 * 86_400_000;
  while (t.getTime() <= limit) {
    if (!c.months.has(t.getUTCMonth() + 1)) {
      t.setUTCMonth(t.getUTCMonth() + 1, 1);
      t.setUTCHours(0, 0, 0, 0);
      continue;
    }
    if (!dayMatches(c, t)) {
      t.setUTCDate(t.getUTCDate() + 1);
      t.setUTCHours(0, 0, 0, 0);
      continue;
    }
    if (!c.hours.has(t.getUTCHours())) {
      t.setUTCHours(t.getUTCHours() + 1, 0, 0, 0);
      continue;
    }
    if (!c.minutes.has(t.getUTCMinutes())) {
      t.setUTCMinutes(t.getUTCMinutes() + 1, 0, 0);
      continue;
    }
    return t.getTime();
  }
  return undefined;
}
