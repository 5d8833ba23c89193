// How a service process lives: start it, serve, and on SIGTERM or SIGINT drain it (health goes
// NOT_SERVING, running calls get a grace period) and flush telemetry before exiting. Several
// services may share one process (`troupe up --one-process`): they start in the order given and
// drain in the reverse order, each still on its own ports.
import { unknownVariables } from "../config/config.js";
import type { Config } from "../config/config-types.js";
import { resumeOptimizationOnceBusy } from "./deferred-tiering.js";
import { exitProcess } from "./exit.js";
import { describeTrim, startIdleTrim } from "./idle-trim.js";
import { createLogger, type Logger, routeNodeWarnings } from "./log.js";
import { startMetrics, type Metrics } from "./metrics.js";
import { useOutboundProxy } from "../net/outbound-proxy.js";
import { routeGrpcLogs } from "../rpc.js";
import { startTelemetry } from "./telemetry.js";

export interface RunningService {
  /** Stop taking work, finish or cancel what is running, release resources. */
  drain(): Promise<void>;
}

export type ServiceStarter = (cfg: Config, logger: Logger) => Promise<RunningService>;

/** One service of a process: its name (for logs), its configuration and how it starts. */
export interface ServiceUnit {
  name: string;
  cfg: Config;
  start: ServiceStarter;
}

export const runService = (name: string, cfg: Config, start: ServiceStarter): Promise<void> =>
  runServices(name, [{ name, cfg, start }]);

/**
 * Runs `units` in this process until a signal. Telemetry and metrics are the process's, named
 * after `processName` and configured by the first unit. `afterDrain` runs once all are drained
 * (troupe up's own cleanup). A unit that fails to start stops the ones started before it.
 */
export async function runServices(
  processName: string,
  units: ServiceUnit[],
  afterDrain: () => Promise<void> = async () => {},
): Promise<void> {
  const { cfg } = units[0];
  useOutboundProxy(cfg.outboundProxy);
  const logger = createLogger(processName, cfg.logLevel, cfg.logFormat);
  routeGrpcLogs(logger);
  routeNodeWarnings(logger);
  for (const name of unknownVariables())
    logger.warn(`${name} is set but Troupe reads no such variable (a typo?); troupe config lists them all`);
  const telemetry = await startTelemetry(processName, cfg.otel);
  let meters: Metrics = { shutdown: async () => {} };
  const running: { name: string; service: RunningService; log: Logger }[] = [];
  const drainAll = async () => {
    for (const { name, service, log } of running.reverse()) {
      try {
        await service.drain();
      } catch (err) {
        log.error(`drain of ${name} failed: ${(err as Error).message}`);
      }
    }
  };
  try {
    meters = await startMetrics(processName, {
      addr: cfg.metricsAddr,
      otlp: cfg.metricsToOtlp ? cfg.otel.protocol : undefined,
      serviceName: cfg.otel.serviceName,
    });
    if (meters.port) logger.info(`metrics at http://${cfg.metricsAddr}/metrics`);
    for (const unit of units) {
      const log = units.length === 1 ? logger : createLogger(unit.name, unit.cfg.logLevel, unit.cfg.logFormat);
      running.push({ name: unit.name, service: await unit.start(unit.cfg, log), log });
    }
  } catch (err) {
    logger.error(`failed to start: ${(err as Error).message}`);
    await drainAll();
    await Promise.all([telemetry.shutdown(), meters.shutdown(), afterDrain()]).catch(() => undefined);
    return exitProcess(1);
  }
  const trimmer = startIdleTrim({ idleMs: cfg.idleTrimMs, onTrim: (t) => logger.debug(describeTrim(t)) });
  const stopDeferring = resumeOptimizationOnceBusy((share) =>
    logger.info(`busy (${Math.round(share * 100)} % of a second): V8's optimizing compilers are on from now`),
  );
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    trimmer.stop();
    stopDeferring();
    logger.info(`${signal}: draining`);
    const grace = Math.max(...units.map((u) => u.cfg.drainGraceMs));
    const hardStop = setTimeout(() => void exitProcess(1), grace * units.length + 5000);
    hardStop.unref();
    await drainAll();
    await Promise.all([telemetry.shutdown(), meters.shutdown(), afterDrain()]).catch(() => undefined);
    logger.info("stopped");
    await exitProcess(0);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
}
