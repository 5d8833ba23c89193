// `troupe sessions ls|show|decide|rm` and `troupe schedules ls|add|rm`: the caller's own sessions
// and their schedules, through the gateway with the caller's API key (what the key's principal
// owns, nothing else; an approver key decides in others' sessions with --principal). --json
// prints one JSON object per line, as the API's JSON mapping has it.
import { toJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { loadConfig } from "../shared/config/config.js";
import { describeError } from "../shared/errors.js";
import { ScheduleSchema } from "../shared/gen/troupe/v1/schedule_pb.js";
import { randomBytes } from "node:crypto";
import {
  ChatMessageSchema,
  Role,
  SessionInfoSchema,
  SessionState,
  type SessionInfo,
} from "../shared/gen/troupe/v1/session_pb.js";
import { parseDecision } from "./decisions.js";
import { CLIENT_FLAGS, gatewayClient, listAllSessions, type GatewayClient } from "./gateway-client.js";
import { printTable } from "./table.js";

const when = (t?: Timestamp) => (t ? new Date(timestampMs(t)).toISOString().replace(/\.\d+Z$/, "Z") : "-");
export const jsonLine = <D extends DescMessage>(schema: D, m: MessageShape<D>) =>
  process.stdout.write(`${JSON.stringify(toJson(schema, m))}\n`);

export class UsageError extends Error {}

/** Runs `work` with a gateway client; a failed call is reported as the status says, exit 1. */
export async function withGateway(
  args: string[],
  extra: Parameters<typeof loadConfig>[2],
  work: (gw: GatewayClient, rest: string[], flags: Record<string, unknown>) => Promise<number>,
): Promise<number> {
  let cfg: ReturnType<typeof loadConfig>;
  try {
    cfg = loadConfig(args, undefined, { json: { type: "boolean" }, ...CLIENT_FLAGS, ...extra });
  } catch (err) {
    process.stderr.write(`troupe: ${(err as Error).message}\n`);
    return 2;
  }
  const gw = await gatewayClient(cfg);
  try {
    return await work(gw, cfg.rest, cfg.flags);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`troupe: ${err.message}\n`);
      return 2;
    }
    process.stderr.write(`troupe: ${describeError(err)}\n`);
    return 1;
  } finally {
    gw.close();
  }
}

const need = (value: string | undefined, what: string): string => {
  if (!value) throw new UsageError(`${what} is missing (troupe --help)`);
  return value;
};

export function sessionsCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const extra = {
    "forget-memories": { type: "boolean" },
    principal: { type: "string" },
    message: { type: "string" },
    args: { type: "string" },
  } as const;
  return withGateway(rest, extra, async (gw, words, flags) => {
    if (sub === "ls") {
      const sessions = await listAllSessions(gw);
      if (flags.json) for (const s of sessions) jsonLine(SessionInfoSchema, s);
      else
        printTable(
          ["SESSION", "AGENT", "MESSAGES", "UPDATED", "STATE"],
          sessions.map((s) => [s.sessionId, s.agentId, String(s.messageCount), when(s.updateTime), stateOf(s)]),
        );
      return 0;
    }
    const sessionId = need(words[0], "the session id");
    if (sub === "show") {
      let pageToken = "";
      do {
        const page = await gw.getHistory({ sessionId, pageSize: 1000, pageToken });
        for (const m of page.messages) {
          if (flags.json) jsonLine(ChatMessageSchema, m);
          else {
            const who = m.role === Role.TOOL ? `tool ${m.toolName}` : Role[m.role].toLowerCase();
            process.stdout.write(`[${when(m.time)}] ${who}: ${m.text}\n`);
          }
        }
        pageToken = page.nextPageToken;
      } while (pageToken);
      const info = (await listAllSessions(gw)).find((s) => s.sessionId === sessionId);
      if (info && !flags.json) printPending(info);
      return 0;
    }
    if (sub === "decide") {
      const toolCallId = need(words[1], "the tool call id");
      const said = parseDecision(
        [need(words[2], "approve, reject or edit"), flags.message ?? flags.args ?? ""].join(" "),
      );
      if (!said) throw new UsageError(`the decision is approve, reject or edit, not ${JSON.stringify(words[2])}`);
      if ("error" in said) throw new UsageError("edit takes --args '{\"name\": value}' (a JSON object)");
      const res = await gw.decideToolCall({
        sessionId,
        frameId: `cli-decide-${randomBytes(6).toString("hex")}`,
        principal: String(flags.principal ?? ""),
        toolCallId,
        ...said,
      });
      const dup = res.accepted?.payload.case === "frameAccepted" && res.accepted.payload.value.duplicate;
      process.stdout.write(`${toolCallId}: ${words[2]}${dup ? " (already decided so)" : ""}\n`);
      return 0;
    }
    const res = await gw.deleteSession({ sessionId, forgetMemories: flags["forget-memories"] === true });
    const parts = [
      res.sandboxRemoved ? "its sandbox removed" : "",
      flags["forget-memories"] ? `${res.memoriesForgotten} memories forgotten` : "",
    ];
    process.stdout.write(
      `deleted ${sessionId}${parts.some(Boolean) ? ` (${parts.filter(Boolean).join(", ")})` : ""}\n`,
    );
    return 0;
  });
}

/** A session's state in a word; a waiting one says on how many calls. */
function stateOf(s: SessionInfo): string {
  if (s.state === SessionState.WAITING) return `waiting (${s.pending.length})`;
  if (s.state === SessionState.RUNNING || s.running) return "running";
  if (s.state === SessionState.FAILED) return "failed";
  return "idle";
}

/** The calls a session's run waits on, who may decide and until when. */
function printPending(info: SessionInfo): void {
  for (const p of info.pending)
    process.stdout.write(
      `waiting since ${when(p.since)}: ${p.toolName} ${p.argumentsJson} (call ${p.toolCallId})\n` +
        `  ${p.rule}; ${p.principal} or the tenant's approvers decide; on ${when(p.deadline)} the policy will ${p.onTimeout}\n` +
        `  troupe sessions decide ${info.sessionId} ${p.toolCallId} approve|reject|edit\n`,
    );
}

export function schedulesCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const extra = {
    cron: { type: "string" },
    tz: { type: "string" },
    every: { type: "string" },
    id: { type: "string" },
  } as const;
  return withGateway(rest, extra, async (gw, words, flags) => {
    const sessionId = need(words[0], "the session id");
    if (sub === "ls") {
      const { schedules } = await gw.listSchedules({ sessionId });
      if (flags.json) for (const s of schedules) jsonLine(ScheduleSchema, s);
      else
        printTable(
          ["ID", "WHEN", "NEXT", "LAST", "TEXT"],
          schedules.map((s) => [
            s.scheduleId,
            s.when.case === "cron" ? `cron "${s.when.value}" ${s.timeZone || "UTC"}` : `every ${s.when.value} s`,
            when(s.nextFireTime),
            when(s.lastFireTime),
            s.text.length > 60 ? `${s.text.slice(0, 57)}...` : s.text,
          ]),
        );
      return 0;
    }
    if (sub === "rm") {
      const scheduleId = need(words[1], "the schedule id");
      if (!(await gw.deleteSchedule({ sessionId, scheduleId })).deleted) {
        process.stderr.write(`troupe: no schedule ${scheduleId} in session ${sessionId}\n`);
        return 1;
      }
      process.stdout.write(`deleted ${scheduleId}\n`);
      return 0;
    }
    const cron = flags.cron as string | undefined;
    const every = flags.every as string | undefined;
    if ((cron === undefined) === (every === undefined))
      throw new UsageError("schedules add needs --cron EXPR or --every SECONDS");
    if (every !== undefined && !/^\d+$/.test(every))
      throw new UsageError(`--every must be a number of seconds, not ${every}`);
    const { schedule } = await gw.createSchedule({
      schedule: {
        sessionId,
        scheduleId: (flags.id as string | undefined) ?? "",
        when: cron !== undefined ? { case: "cron", value: cron } : { case: "everySeconds", value: Number(every) },
        timeZone: (flags.tz as string | undefined) ?? "",
        text: words.slice(1).join(" "),
      },
    });
    process.stdout.write(`scheduled ${schedule!.scheduleId}; next ${when(schedule!.nextFireTime)}\n`);
    return 0;
  });
}
