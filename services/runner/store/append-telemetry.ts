// One durable batch of session-log records, as a span and the append histogram. The span hangs
// under the context that started the batch: the run whose record came first. A PostgreSQL batch may
// carry other sessions' records too; troupe.store.sessions says how many shared it.
import { SpanStatusCode } from "@opentelemetry/api";
import { instruments, secondsSince } from "../../shared/process/metrics.js";
import { tracer } from "../../shared/process/telemetry.js";

export interface AppendBatch {
  store: "files" | "postgres";
  records: number;
  sessions: number;
  /** The file store's flag: this batch was fsynced before it was acknowledged. */
  sync?: boolean;
}

/** Starts timing a batch; call the result once when it is durable (or failed with `err`). */
export function appendStarted(batch: AppendBatch): (err?: unknown) => void {
  const started = performance.now();
  const attributes = {
    "troupe.store": batch.store,
    "troupe.store.records": batch.records,
    "troupe.store.sessions": batch.sessions,
    ...(batch.sync === undefined ? {} : { "troupe.store.sync": batch.sync }),
  };
  const span = tracer.startSpan("append session log", { attributes });
  return (err) => {
    if (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
    } else {
      const labels =
        batch.sync === undefined
          ? { "troupe.store": batch.store }
          : { "troupe.store": batch.store, "troupe.store.sync": batch.sync };
      instruments().storeAppend.record(secondsSince(started), labels);
    }
    span.end();
  };
}
