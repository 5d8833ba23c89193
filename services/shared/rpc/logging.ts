// grpc-js's own log lines (a refused TLS context, a server that answers with too many pings, a
// listener that failed) go to the process's logger as JSON records, not to stderr as its default
// "E <text>" lines among them. Its verbosity stays its own (GRPC_VERBOSITY, default ERROR).
import { format } from "node:util";
import * as grpc from "@grpc/grpc-js";
import type { Logger } from "../process/log.js";

/** Routes grpc-js's logging, process-wide, to `logger`. The last call wins. */
export function routeGrpcLogs(logger: Logger): void {
  const fields = { component: "grpc-js" };
  grpc.setLogger({
    error: (...args: unknown[]) => logger.error(format(...args), fields),
    info: (...args: unknown[]) => logger.info(format(...args), fields),
    debug: (...args: unknown[]) => logger.debug(format(...args), fields),
  });
}
