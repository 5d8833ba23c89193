// Logs: one record per line on stderr, through pino. JSON lines (`TROUPE_LOG_FORMAT=json`, and the
// default when stderr is not a terminal: kubectl logs, a log shipper, troupe up's files) or a plain
// line for people (`text`, the default on a terminal): `time level service: message {fields}`.
//
// Every record made inside a turn or a call carries what it is about: the trace and span ids of
// the active span (when tracing is on) and the tenant and session the context names
// (withLogFields). Values under keys that name secrets are replaced before anything is written.
import { context, createContextKey, isSpanContextValid, trace, type Context } from "@opentelemetry/api";
import pino from "pino";

export type Level = "debug" | "info" | "warn" | "error";
export type LogFormat = "json" | "text" | "auto";

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

const FIELDS = createContextKey("troupe.log.fields");

/** What every record made under the returned context says it is about (tenant, session). */
export function withLogFields(parent: Context, fields: { tenant?: string; session_id?: string }): Context {
  const before = parent.getValue(FIELDS) as Record<string, string> | undefined;
  const set = Object.fromEntries(Object.entries(fields).filter(([, v]) => v));
  return Object.keys(set).length === 0 ? parent : parent.setValue(FIELDS, { ...before, ...set });
}

/** Keys whose values never reach a log, at the top level or one object down. */
const SECRET_KEYS = ["apiKey", "api_key", "authorization", "token", "password", "secret", "key"];
const REDACT = [...SECRET_KEYS, ...SECRET_KEYS.map((k) => `*.${k}`)];

/** The active span's ids and the context's fields, on every record. */
function aboutNow(): Record<string, unknown> {
  const ctx = context.active();
  const fields = ctx.getValue(FIELDS) as Record<string, string> | undefined;
  const span = trace.getSpanContext(ctx);
  if (!span || !isSpanContextValid(span)) return fields ?? {};
  return { ...fields, trace_id: span.traceId, span_id: span.spanId };
}

/**
 * The fields that log an unexpected failure (a bug, not a refused request or an unreachable
 * peer): its stack, so the record says where it came from, cut to 4,000 characters.
 */
export function failure(err: unknown): { error: string } {
  return { error: String((err as Error | undefined)?.stack ?? err).slice(0, 4000) };
}

/** A record as a plain line: `time level service: message {fields}`. */
export const textLine = (o: Record<string, unknown>): string => {
  const { time, level, service, msg, ...rest } = o;
  const extra = Object.keys(rest).length > 0 ? ` ${JSON.stringify(rest)}` : "";
  return `${time} ${String(level).padEnd(5)} ${service}: ${msg}${extra}\n`;
};

export function createLogger(service: string, level: Level, format: LogFormat = "auto"): Logger {
  const json = format === "json" || (format === "auto" && !process.stderr.isTTY);
  const destination = json
    ? pino.destination({ fd: 2, sync: true })
    : {
        // pino hands each record over as JSON text; a terminal gets it as one plain line.
        write: (line: string) => void process.stderr.write(textLine(JSON.parse(line))),
      };
  const base = pino(
    {
      level,
      base: { service },
      messageKey: "msg",
      timestamp: () => `,"time":"${new Date().toISOString()}"`,
      formatters: { level: (label) => ({ level: label }) },
      mixin: aboutNow,
      redact: { paths: REDACT, censor: "[redacted]" },
    },
    destination,
  );
  const at =
    (lvl: Level) =>
    (msg: string, fields?: Record<string, unknown>): void =>
      fields ? base[lvl](fields, msg) : base[lvl](msg);
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

/**
 * Node's own process warnings (a deprecation, a listener leak) as `logger`'s records with
 * `component: "node"`, in place of the plain "(node:PID) Warning: ..." line Node prints on stderr.
 * Process-wide; the last call wins.
 */
export function routeNodeWarnings(logger: Logger): void {
  process.removeAllListeners("warning");
  process.on("warning", (w: Error & { code?: string }) =>
    logger.warn(`${w.name}: ${w.message}`, { component: "node", ...(w.code ? { code: w.code } : {}) }),
  );
}
