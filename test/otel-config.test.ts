// The standard OTEL_* variables reach the OTel SDK: protocol, headers, resource attributes, service
// name, sampler, OTEL_SDK_DISABLED. Each case is a router process of its own exporting to a
// collector run here; its health checks are the spans, and stopping it flushes them.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { once } from "node:events";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

interface Export {
  path: string;
  contentType: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

const exports: Export[] = [];
let collector: http.Server;
let endpoint: string;
let stack: Stack;

before(async () => {
  collector = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const contentType = String(req.headers["content-type"] ?? "");
    exports.push({ path: req.url ?? "", contentType, headers: req.headers, body: Buffer.concat(chunks) });
    // An empty body is a full success in either encoding (OTLP/HTTP, "Full Success").
    res.writeHead(200, { "content-type": contentType || "application/json" }).end();
  });
  collector.listen(0, "127.0.0.1");
  await once(collector, "listening");
  endpoint = `http://127.0.0.1:${(collector.address() as { port: number }).port}`;
  stack = await startStack({ services: ["router"] });
});

after(async () => {
  await stack?.stop();
  collector?.close();
});

/** JSON exports on `path` whose resource names `service`, as resource attribute maps. */
function jsonResources(path: string, service: string): Record<string, unknown>[] {
  const found: Record<string, unknown>[] = [];
  for (const e of exports.filter((x) => x.path === path && x.contentType.includes("json"))) {
    const body = JSON.parse(e.body.toString("utf8")) as Record<string, { resource?: { attributes?: [] } }[]>;
    for (const r of body.resourceSpans ?? body.resourceMetrics ?? []) {
      const attrs = Object.fromEntries(
        (r.resource?.attributes ?? []).map((a: { key: string; value: { stringValue?: string } }) => [
          a.key,
          a.value.stringValue,
        ]),
      );
      if (attrs["service.name"] === service) found.push(attrs);
    }
  }
  return found;
}

test("protocol, headers and resource attributes reach the collector with the default name", async () => {
  await stack.startInstance("router-json", "router", {
    env: {
      OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_EXPORTER_OTLP_HEADERS: "x-collector-token=s3cret",
      OTEL_RESOURCE_ATTRIBUTES: "deployment.environment.name=ci,service.namespace=troupe",
      OTEL_BSP_SCHEDULE_DELAY: "50",
    },
  });
  // Stopping drains the process: its spans and its metrics are flushed before it exits.
  assert.equal(await stack.kill("router-json"), 0);
  const spans = jsonResources("/v1/traces", "troupe-router");
  assert.ok(spans.length > 0, `no JSON spans from troupe-router; got ${exports.map((e) => e.path)}`);
  assert.equal(spans[0]["deployment.environment.name"], "ci");
  assert.equal(spans[0]["service.namespace"], "troupe");
  const traced = exports.find((e) => e.path === "/v1/traces" && e.body.includes("troupe-router"));
  assert.equal(traced?.headers["x-collector-token"], "s3cret");
  const metrics = jsonResources("/v1/metrics", "troupe-router");
  assert.ok(metrics.length > 0, "the OTLP metrics carry the same resource");
  assert.equal(metrics[0]["deployment.environment.name"], "ci");
});

test("by default spans go as protobuf, and OTEL_SERVICE_NAME names the service", async () => {
  await stack.startInstance("router-proto", "router", {
    env: { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_SERVICE_NAME: "edge-router", OTEL_METRICS_EXPORTER: "none" },
  });
  assert.equal(await stack.kill("router-proto"), 0);
  const proto = await waitFor("a protobuf export naming edge-router", async () =>
    exports.find((e) => e.path === "/v1/traces" && e.body.includes("edge-router")),
  );
  assert.equal(proto.contentType, "application/x-protobuf");
  assert.ok(!exports.some((e) => e.path === "/v1/metrics" && e.body.includes("edge-router")), "metrics were off");
});

test("OTEL_SDK_DISABLED and the always_off sampler export nothing", async () => {
  const common = { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" };
  await stack.startInstance("router-off", "router", {
    env: { ...common, OTEL_SDK_DISABLED: "true", OTEL_SERVICE_NAME: "disabled-router" },
  });
  await stack.startInstance("router-unsampled", "router", {
    env: { ...common, OTEL_TRACES_SAMPLER: "always_off", OTEL_SERVICE_NAME: "unsampled-router" },
  });
  assert.equal(await stack.kill("router-off"), 0);
  assert.equal(await stack.kill("router-unsampled"), 0);
  assert.deepEqual(jsonResources("/v1/traces", "disabled-router"), []);
  assert.deepEqual(jsonResources("/v1/metrics", "disabled-router"), [], "disabled means no OTLP metrics either");
  assert.deepEqual(jsonResources("/v1/traces", "unsampled-router"), []);
  // The unsampled one still exports its metrics: the sampler is about traces only.
  assert.ok(jsonResources("/v1/metrics", "unsampled-router").length > 0);
});

test("an unknown sampler or protocol stops the start and says which variable", async () => {
  for (const [name, value] of [
    ["OTEL_TRACES_SAMPLER", "sometimes"],
    ["OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"],
    ["OTEL_TRACES_SAMPLER_ARG", "1.5"],
  ]) {
    await assert.rejects(
      stack.startInstance(`router-bad-${name}`, "router", {
        env: { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, [name]: value },
      }),
      (err: Error) => err.message.includes("exited") && err.message.includes(name),
    );
  }
});
