// `manage_schedule`: the agent lists, creates and deletes its own session's schedules (a reminder
// at a cron time in a time zone, or a heartbeat every so many seconds). The same book and the same
// checks as the gateway's schedule API (schedules.ts), under the session owner's quota; a schedule
// made here fires into this session only, as one its owner made would.
import { create } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { RpcError } from "../../shared/errors.js";
import { ScheduleSchema, type Schedule } from "../../shared/gen/troupe/v1/schedule_pb.js";
import type { SessionRef } from "../../shared/session-ref.js";
import type { ScheduleBook } from "../schedules/schedules.js";
import type { Tool, ToolResult } from "./tools.js";

export interface ScheduleToolDeps {
  book: ScheduleBook;
  /** The session's schedules changed: the scheduler reads them again. */
  changed(): void;
  /** The owner's quota of schedules per session. */
  max(): number;
  /** The frame of the message this run answers, kept as the schedule's origin (its replies' chat). */
  origin(): Promise<string>;
}

const line = (s: Schedule) => {
  const when = s.when.case === "cron" ? `cron "${s.when.value}" ${s.timeZone || "UTC"}` : `every ${s.when.value} s`;
  const next = s.nextFireTime ? new Date(timestampMs(s.nextFireTime)).toISOString() : "never";
  return `${s.scheduleId}: ${when}; next ${next}; "${s.text.slice(0, 200)}"`;
};

const wrong = (text: string): ToolResult => ({ output: `manage_schedule: ${text}`, isError: true });

export function scheduleTool(ref: SessionRef, deps: ScheduleToolDeps): Tool {
  return {
    name: "manage_schedule",
    description:
      "List, create or delete this session's schedules. A schedule starts a turn here with its text: at the times of a 5-field cron expression (minute hour day-of-month month day-of-week) in an IANA time zone, or every N seconds.",
    parameters: {
      type: "object",
      properties: {
        action: { type: "string", enum: ["list", "create", "delete"] },
        schedule_id: {
          type: "string",
          description: "Create: optional (made up if absent; the same id replaces). Delete: required.",
        },
        cron: { type: "string", description: 'Create: e.g. "0 9 * * mon-fri".' },
        time_zone: { type: "string", description: 'Create with cron: e.g. "Europe/Berlin" (default UTC).' },
        every_seconds: { type: "integer", minimum: 1, description: "Create: a heartbeat instead of cron." },
        text: { type: "string", description: "Create: the message the scheduled turn starts with." },
      },
      required: ["action"],
      additionalProperties: false,
    },
    async execute(args) {
      const id = typeof args.schedule_id === "string" ? args.schedule_id : "";
      try {
        switch (args.action) {
          case "list": {
            const all = deps.book.list(await deps.book.read(ref));
            return { output: all.length ? all.map(line).join("\n") : "(no schedules)", isError: false };
          }
          case "create": {
            const hasCron = typeof args.cron === "string";
            if (hasCron === (args.every_seconds !== undefined)) return wrong("give either `cron` or `every_seconds`");
            const schedule = create(ScheduleSchema, {
              scheduleId: id,
              sessionId: ref.sessionId,
              when: hasCron
                ? { case: "cron", value: args.cron as string }
                : { case: "everySeconds", value: Number(args.every_seconds) },
              timeZone: typeof args.time_zone === "string" ? args.time_zone : "",
              text: typeof args.text === "string" ? args.text : "",
            });
            const made = await deps.book.put(ref, schedule, deps.max(), await deps.origin());
            deps.changed();
            return { output: `scheduled ${line(made)}`, isError: false };
          }
          case "delete": {
            if (id === "") return wrong("`schedule_id` is required to delete");
            const removed = await deps.book.remove(ref, id);
            deps.changed();
            return removed ? { output: `deleted ${id}`, isError: false } : wrong(`no schedule ${id} in this session`);
          }
          default:
            return wrong("`action` must be list, create or delete");
        }
      } catch (err) {
        // The book's checks (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) say what is wrong in words the model can act on.
        return wrong(err instanceof RpcError ? err.message : `the schedule store failed: ${(err as Error).message}`);
      }
    },
  };
}
