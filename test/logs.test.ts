// Logs as a log shipper reads them: with TROUPE_LOG_FORMAT=json every service writes JSON lines,
// and the records a turn makes carry its trace id (the client's own, from its traceparent), span
// id, tenant and session. A bad level or format stops the start with the reason.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import http from "node:http";
import { once } from "node:events";
import { promisify } from "node:util";
import { grpc } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { MAIN, startStack, waitFor, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);
let collector: http.Server;
let stack: Stack;

before(async () => {
  // Tracing on (spans are taken and dropped), so records have span ids to carry.
  collector = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end("{}"));
  });
  collector.listen(0, "127.0.0.1");
  await once(collector, "listening");
  const port = (collector.address() as { port: number }).port;
  stack = await startStack({
    env: {
      TROUPE_LOG_FORMAT: "json",
      TROUPE_LOG_LEVEL: "debug",
      TROUPE_SANDBOX_POOL: "0",
      TROUPE_MEMORY_LEARN: "0",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`,
      OTEL_METRICS_EXPORTER: "none",
    },
  });
});
after(async () => {
  await stack?.stop();
  collector?.close();
});

const records = () =>
  stack
    .logs()
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>);

test("every service writes JSON lines", () => {
  const lines = stack
    .logs()
    .split("\n")
    .filter((l) => l.trim() !== "");
  const json = records();
  assert.ok(json.length > 0);
  assert.deepEqual(
    lines.filter((l) => !l.startsWith("{")),
    [],
    "no plain lines",
  );
  const services = new Set(json.map((r) => r.service));
  for (const s of ["router", "memory", "sandbox", "runner", "gateway"]) assert.ok(services.has(s), `${s} logged`);
  for (const r of json)
    assert.ok(typeof r.time === "string" && typeof r.level === "string" && typeof r.msg === "string");
});

test("a turn's records carry the client's trace id, a span id, the tenant and the session", async () => {
  const traceId = "0af7651916cd43dd8448eb211c80319c";
  const metadata = new grpc.Metadata();
  metadata.set("traceparent", `00-${traceId}-b7ad6b7169203331-01`);
  const s = new ChatSession(stack.gateway, { metadata });
  s.open();
  const opened = await s.waitOpened();
  s.prompt("$ echo logged");
  await s.waitForPayload("agentEnd", 30_000);
  s.close();
  const ended = await waitFor("the run's record", async () =>
    records().find((r) => r.msg === "run ended" && r.session_id === opened.sessionId),
  );
  assert.equal(ended.service, "runner");
  assert.equal(ended.tenant, "local");
  assert.equal(ended.trace_id, traceId);
  assert.match(String(ended.span_id), /^[0-9a-f]{16}$/);
  assert.equal(ended.stop_reason, "COMPLETED");
});

test("a bad level or format stops the start, naming the setting", async () => {
  for (const [variable, value, says] of [
    ["TROUPE_LOG_LEVEL", "loud", /TROUPE_LOG_LEVEL/],
    ["TROUPE_LOG_FORMAT", "xml", /TROUPE_LOG_FORMAT/],
  ] as const) {
    const failed = await run(process.execPath, [MAIN, "router", "--router", "127.0.0.1:0"], {
      timeout: 20_000,
      env: { ...process.env, [variable]: value },
    }).catch((e) => e);
    assert.notEqual(failed.code, 0);
    assert.match(failed.stderr, says);
    assert.match(failed.stderr, /must be one of/);
  }
});
