// How a service process lives: start it, serve, and on SIGTERM or SIGINT drain it (health goes
// NOT_SERVING, running calls get a grace period) and flush telemetry before exiting.
import { unknownVariables, type Config } from "./config.js";
import { createLogger, type Logger } from "./log.js";
import { startMetrics, type Metrics } from "./metrics.js";
import { startTelemetry } from "./telemetry.js";

export interface RunningService {
  /** Stop taking work, finish or cancel what is running, release resources. */
  drain(): Promise<void>;
}

export type ServiceStarter = (cfg: Config, logger: Logger) => Promise<RunningService>;

export async function runService(name: string, cfg: Config, start: ServiceStarter): Promise<void> {
  const logger = createLogger(name, cfg.logLevel, cfg.logFormat);
  for (const name of unknownVariables())
    logger.warn(`${name} is set but Troupe reads no such variable (a typo?); troupe config lists them all`);
  const telemetry = await startTelemetry(name, cfg.otel);
  let meters: Metrics = { shutdown: async () => {} };
  let service: RunningService;
  try {
    meters = await startMetrics(name, {
      addr: cfg.metricsAddr,
      otlp: cfg.metricsToOtlp ? cfg.otel.protocol : undefined,
      serviceName: cfg.otel.serviceName,
    });
    if (meters.port) logger.info(`metrics at http://${cfg.metricsAddr}/metrics`);
    service = await start(cfg, logger);
  } catch (err) {
    logger.error(`failed to start: ${(err as Error).message}`);
    await Promise.all([telemetry.shutdown(), meters.shutdown()]);
    process.exit(1);
  }
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info(`${signal}: draining`);
    const hardStop = setTimeout(() => process.exit(1), cfg.drainGraceMs + 5000);
    hardStop.unref();
    try {
      await service.drain();
    } catch (err) {
      logger.error(`drain failed: ${(err as Error).message}`);
    }
    await Promise.all([telemetry.shutdown(), meters.shutdown()]).catch(() => undefined);
    logger.info("stopped");
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
}
