// Tracing through @opentelemetry/api only. The SDK and the OTLP exporter are loaded at process
// start, and only when OTEL_EXPORTER_OTLP_ENDPOINT is set; otherwise every span is a no-op.
import {
  ROOT_CONTEXT,
  context,
  propagation,
  trace,
  type Context,
  type TextMapGetter,
  type TextMapSetter,
} from "@opentelemetry/api";
import type { Metadata } from "@grpc/grpc-js";
import type { Config } from "../config/config-types.js";

export const tracer = trace.getTracer("troupe", "0.1.0");

// GenAI semantic-convention attribute names (Development stability), copied here rather than
// imported from @opentelemetry/semantic-conventions/incubating, which may break in minor releases.
export const GenAI = {
  OPERATION_NAME: "gen_ai.operation.name",
  PROVIDER_NAME: "gen_ai.provider.name",
  REQUEST_MODEL: "gen_ai.request.model",
  REQUEST_MAX_TOKENS: "gen_ai.request.max_tokens",
  REQUEST_STREAM: "gen_ai.request.stream",
  RESPONSE_MODEL: "gen_ai.response.model",
  RESPONSE_ID: "gen_ai.response.id",
  RESPONSE_FINISH_REASONS: "gen_ai.response.finish_reasons",
  RESPONSE_TIME_TO_FIRST_CHUNK: "gen_ai.response.time_to_first_chunk",
  USAGE_INPUT_TOKENS: "gen_ai.usage.input_tokens",
  USAGE_OUTPUT_TOKENS: "gen_ai.usage.output_tokens",
  USAGE_CACHE_READ_INPUT_TOKENS: "gen_ai.usage.cache_read.input_tokens",
  CONVERSATION_ID: "gen_ai.conversation.id",
  AGENT_ID: "gen_ai.agent.id",
  AGENT_NAME: "gen_ai.agent.name",
  TOOL_NAME: "gen_ai.tool.name",
  TOOL_CALL_ID: "gen_ai.tool.call.id",
  TOOL_TYPE: "gen_ai.tool.type",
  TOOL_DESCRIPTION: "gen_ai.tool.description",
  ERROR_TYPE: "error.type",
} as const;

const metadataGetter: TextMapGetter<Metadata> = {
  keys: (m) => Object.keys(m.getMap()),
  get: (m, key) => {
    const values = m.get(key);
    return values.length === 0 ? undefined : values.map(String);
  },
};
const metadataSetter: TextMapSetter<Metadata> = { set: (m, key, value) => m.set(key, value) };
const recordGetter: TextMapGetter<Record<string, string>> = { keys: (r) => Object.keys(r), get: (r, k) => r[k] };
const recordSetter: TextMapSetter<Record<string, string>> = { set: (r, k, v) => void (r[k] = v) };

export const extractContext = (metadata: Metadata): Context =>
  propagation.extract(ROOT_CONTEXT, metadata, metadataGetter);
export const injectContext = (ctx: Context, metadata: Metadata): void =>
  propagation.inject(ctx, metadata, metadataSetter);

/** Trace context as a string map, for carriers that are not call metadata (a stream's frames). */
/** The context a span makes for what runs under it. */
export const spanContext = (parent: Context, span: ReturnType<typeof tracer.startSpan>): Context =>
  trace.setSpan(parent, span);

export function contextToRecord(ctx: Context = context.active()): Record<string, string> {
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier, recordSetter);
  return carrier;
}
export const contextFromRecord = (carrier: Record<string, string>): Context =>
  propagation.extract(ROOT_CONTEXT, carrier, recordGetter);

export interface Telemetry {
  shutdown(): Promise<void>;
}

/**
 * Starts the OTel Node SDK for this process when tracing is configured (an OTLP endpoint, or
 * OTEL_TRACES_EXPORTER naming another exporter; never under OTEL_SDK_DISABLED=true). The SDK reads
 * the standard variables itself: protocol, headers, sampler and its argument, resource attributes,
 * batching. Without them nothing of the SDK is loaded and every span is the API's no-op.
 */
export async function startTelemetry(serviceName: string, otel: Config["otel"]): Promise<Telemetry> {
  // The context follows async work even without tracing: log records find their tenant and
  // session in it (log.ts, withLogFields).
  const { AsyncLocalStorageContextManager } = await import("@opentelemetry/context-async-hooks");
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  if (!otel.tracing) return { shutdown: async () => {} };
  const [{ NodeSDK }, { resourceFromAttributes }] = await Promise.all([
    import("@opentelemetry/sdk-node"),
    import("@opentelemetry/resources"),
  ]);
  const sdk = new NodeSDK({
    // The default name yields to OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (the env detector).
    resource: resourceFromAttributes({ "service.name": defaultServiceName(serviceName) }),
    // Our own context manager is already set; metrics are startMetrics' (Prometheus and OTLP);
    // logs go to stdout through pino, not through the OTel logs SDK.
    contextManager: null as never,
    metricReaders: [],
    logRecordProcessors: [],
  });
  sdk.start();
  return { shutdown: () => sdk.shutdown() };
}

export const defaultServiceName = (service: string) => `troupe-${service}`;
