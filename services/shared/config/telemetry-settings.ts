// The tracing and metrics settings: the standard OTEL_* variables Troupe honours (docs/tracing.md,
// Observability) and its own Prometheus address. A section of settings.ts.
import { int, oneOf, type Setting } from "./setting-kinds.js";

export const TELEMETRY_SETTINGS = {
  otelEndpoint: { env: "OTEL_EXPORTER_OTLP_ENDPOINT", doc: "OTLP endpoint for traces and metrics (unset: off)" },
  otelTracesEndpoint: {
    env: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    doc: "OTLP endpoint for traces only (turns tracing on too)",
  },
  otelProtocol: {
    env: "OTEL_EXPORTER_OTLP_PROTOCOL",
    doc: "OTLP's encoding for traces and metrics",
    default: "http/protobuf",
    schema: oneOf("http/protobuf", "http/json", "grpc"),
  },
  otelHeaders: {
    env: "OTEL_EXPORTER_OTLP_HEADERS",
    doc: "key=value,... sent with every OTLP export (read by the OTel SDK)",
    secret: true,
  },
  otelTracesExporter: {
    env: "OTEL_TRACES_EXPORTER",
    doc: "where spans go; console or zipkin turn tracing on without an endpoint",
    default: "otlp",
    schema: oneOf("otlp", "console", "zipkin", "none"),
  },
  otelSampler: {
    env: "OTEL_TRACES_SAMPLER",
    doc: "which traces are kept",
    default: "parentbased_always_on",
    schema: oneOf(
      "always_on",
      "always_off",
      "traceidratio",
      "parentbased_always_on",
      "parentbased_always_off",
      "parentbased_traceidratio",
    ),
  },
  otelSamplerArg: {
    env: "OTEL_TRACES_SAMPLER_ARG",
    doc: "the ratio samplers' fraction of traces kept",
    default: 1,
    schema: { type: "number", minimum: 0, maximum: 1, message: "must be a number from 0 to 1" },
  },
  otelResourceAttributes: {
    env: "OTEL_RESOURCE_ATTRIBUTES",
    doc: "key=value,... added to every span's and metric's resource",
  },
  otelSdkDisabled: {
    env: "OTEL_SDK_DISABLED",
    doc: "true: no traces and no OTLP metrics, whatever else is set (Prometheus stays)",
    default: "false",
    schema: oneOf("true", "false"),
  },
  metricsAddr: {
    env: "TROUPE_METRICS_ADDR",
    flag: "metrics",
    doc: "Prometheus metrics at http://HOST:PORT/metrics (unset: none); troupe up gives each further service the next port",
  },
  otelMetricsExporter: {
    env: "OTEL_METRICS_EXPORTER",
    doc: "metrics to the OTLP endpoint too (otlp), or not (none)",
    default: "otlp",
    schema: oneOf("otlp", "none"),
  },
  otelServiceName: {
    env: "OTEL_SERVICE_NAME",
    doc: "service name in traces and metrics",
    default: "troupe-<service>",
  },
  bspScheduleDelay: {
    env: "OTEL_BSP_SCHEDULE_DELAY",
    doc: "span batch delay (ms; read by the OTel SDK)",
    schema: int(0),
  },
  bspExportTimeout: { env: "OTEL_BSP_EXPORT_TIMEOUT", doc: "span export timeout (ms)", schema: int(0) },
  bspMaxQueueSize: { env: "OTEL_BSP_MAX_QUEUE_SIZE", doc: "span queue size", schema: int() },
  bspMaxExportBatchSize: { env: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", doc: "span batch size", schema: int() },
} as const satisfies Record<string, Setting>;
