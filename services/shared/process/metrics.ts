// Metrics through @opentelemetry/api. The SDK is loaded only when something reads them: a
// Prometheus endpoint (TROUPE_METRICS_ADDR, GET /metrics) and/or OTLP (when the OTLP endpoint is
// set, OTEL_METRICS_EXPORTER is not "none" and OTEL_SDK_DISABLED is not "true"). Otherwise every instrument is the API's no-op.
//
// The OTel JS metrics API has no proxy provider: a meter taken before the SDK is set stays a
// no-op. So instruments are made on first use (instruments()), after runService started this.
import { metrics, type Counter, type Histogram, type Meter } from "@opentelemetry/api";
import type { AggregationType, ViewOptions } from "@opentelemetry/sdk-metrics";
import { splitHostPort } from "../net/host-port.js";
import { defaultServiceName } from "./telemetry.js";

export interface MetricsConfig {
  /** host:port for Prometheus' /metrics; empty: none. */
  addr: string;
  /** Metrics go to OTLP too, in this encoding (the exporter reads endpoint and headers itself). */
  otlp?: "http/protobuf" | "http/json" | "grpc";
  /** OTEL_SERVICE_NAME, or empty for troupe-<service>. */
  serviceName: string;
}

export interface Metrics {
  /** The Prometheus port, when serving. */
  port?: number;
  shutdown(): Promise<void>;
}

/** Seconds buckets for calls from a millisecond to a few minutes. */
const SECONDS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
const TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576];

export async function startMetrics(service: string, cfg: MetricsConfig): Promise<Metrics> {
  if (!cfg.addr && !cfg.otlp) return { shutdown: async () => {} };
  const [sdk, { resourceFromAttributes, detectResources, envDetector }] = await Promise.all([
    import("@opentelemetry/sdk-metrics"),
    import("@opentelemetry/resources"),
  ]);
  const readers: InstanceType<typeof sdk.MetricReader>[] = [];
  let port: number | undefined;
  if (cfg.addr) {
    const { PrometheusExporter } = await import("@opentelemetry/exporter-prometheus");
    const [host, wanted] = splitHostPort(cfg.addr);
    if (wanted === 0)
      throw new Error(`TROUPE_METRICS_ADDR ${cfg.addr}: name a port, Prometheus must know where to scrape`);
    const exporter = new PrometheusExporter({ host, port: wanted, endpoint: "/metrics", preventServerStart: true });
    await exporter.startServer();
    port = wanted;
    readers.push(exporter);
  }
  if (cfg.otlp) readers.push(new sdk.PeriodicExportingMetricReader({ exporter: await otlpExporter(cfg.otlp) }));
  // The same resource as the spans': the default name, then OTEL_RESOURCE_ATTRIBUTES and
  // OTEL_SERVICE_NAME over it.
  const named = resourceFromAttributes({ "service.name": cfg.serviceName || defaultServiceName(service) });
  const provider = new sdk.MeterProvider({
    resource: named.merge(detectResources({ detectors: [envDetector] })),
    readers,
    views: [
      ...[...SECONDS_INSTRUMENTS].map((name) => buckets(sdk.AggregationType, name, SECONDS)),
      buckets(sdk.AggregationType, "gen_ai.client.token.usage", TOKENS),
    ],
  });
  metrics.setGlobalMeterProvider(provider);
  return { port, shutdown: () => provider.shutdown() };
}

async function otlpExporter(protocol: NonNullable<MetricsConfig["otlp"]>) {
  if (protocol === "grpc") return new (await import("@opentelemetry/exporter-metrics-otlp-grpc")).OTLPMetricExporter();
  if (protocol === "http/json")
    return new (await import("@opentelemetry/exporter-metrics-otlp-http")).OTLPMetricExporter();
  return new (await import("@opentelemetry/exporter-metrics-otlp-proto")).OTLPMetricExporter();
}

/** A histogram view with these bucket boundaries for one instrument. */
function buckets(types: typeof AggregationType, instrumentName: string, boundaries: number[]): ViewOptions {
  return { instrumentName, aggregation: { type: types.EXPLICIT_BUCKET_HISTOGRAM, options: { boundaries } } };
}

const SECONDS_INSTRUMENTS = new Set([
  "rpc.server.call.duration",
  "gen_ai.client.operation.duration",
  "gen_ai.client.operation.time_to_first_chunk",
  "troupe.tool.duration",
  "troupe.sandbox.exec.duration",
  "troupe.store.append.duration",
  "troupe.memory.search.duration",
]);

export interface Instruments {
  meter: Meter;
  rpcDuration: Histogram;
  turns: Counter;
  modelDuration: Histogram;
  timeToFirstChunk: Histogram;
  tokens: Histogram;
  toolDuration: Histogram;
  execDuration: Histogram;
  storeAppend: Histogram;
  memorySearch: Histogram;
  tenantTokens: Counter;
  tenantToolSeconds: Counter;
  httpConnectionsRefused: Counter;
}

let made: Instruments | undefined;

/** Troupe's instruments, made on first use from the global meter provider (see above). */
export function instruments(): Instruments {
  if (made) return made;
  const meter = metrics.getMeter("troupe", "0.1.0");
  const seconds = (name: string, description: string) => meter.createHistogram(name, { unit: "s", description });
  made = {
    meter,
    rpcDuration: seconds("rpc.server.call.duration", "gRPC calls served, by method and status code"),
    turns: meter.createCounter("troupe.turns", {
      description: "runs by phase: started, then completed, aborted or failed (with the error code)",
    }),
    modelDuration: seconds("gen_ai.client.operation.duration", "model calls, by provider, model and error type"),
    timeToFirstChunk: seconds("gen_ai.client.operation.time_to_first_chunk", "from a model request to its first chunk"),
    tokens: meter.createHistogram("gen_ai.client.token.usage", {
      unit: "{token}",
      description: "tokens per model call, by gen_ai.token.type (input, output)",
    }),
    toolDuration: seconds("troupe.tool.duration", "tool calls, by tool and outcome"),
    execDuration: seconds("troupe.sandbox.exec.duration", "sandboxed commands, by outcome"),
    storeAppend: seconds("troupe.store.append.duration", "session-log appends (one durable batch)"),
    memorySearch: seconds("troupe.memory.search.duration", "memory searches"),
    tenantTokens: meter.createCounter("troupe.tenant.tokens", {
      unit: "{token}",
      description: "model tokens used by each tenant, by type",
    }),
    tenantToolSeconds: meter.createCounter("troupe.tenant.tool_time", {
      unit: "s",
      description: "time spent in tool calls by each tenant",
    }),
    httpConnectionsRefused: meter.createCounter("troupe.http.connections.refused", {
      description:
        "HTTP connections the gateway closed or refused, by reason: max_connections, first_byte, head, body, idle",
    }),
  };
  return made;
}

/** Seconds since `startMs` (performance.now() or Date.now(), the same clock). */
export const secondsSince = (startMs: number, now = performance.now()): number => (now - startMs) / 1000;
