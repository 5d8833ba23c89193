// The logger as operators read it: JSON lines with the fields asked for, secrets replaced, the
// tenant and session of the context on every record made under it; plain lines on request.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";

const LOG = new URL("../../services/shared/process/log.js", import.meta.url).href;
const API = import.meta.resolve("@opentelemetry/api");
const HOOKS = import.meta.resolve("@opentelemetry/context-async-hooks");
const GRPC_LOGS = new URL("../../services/shared/rpc/logging.js", import.meta.url).href;
const GRPC = import.meta.resolve("@grpc/grpc-js");

/** Runs `body` in a fresh process with `log` = createLogger("svc", "debug", format); returns its stderr lines. */
function logged(format: string, body: string): string[] {
  const script = `
    const { createLogger, withLogFields } = await import(${JSON.stringify(LOG)});
    const { context, ROOT_CONTEXT } = await import(${JSON.stringify(API)});
    const { AsyncLocalStorageContextManager } = await import(${JSON.stringify(HOOKS)});
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    const log = createLogger("svc", "info", ${JSON.stringify(format)});
    ${body}
  `;
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return r.stderr.split("\n").filter(Boolean);
}

test("JSON lines: time, level, service, message and fields; below the level nothing", () => {
  const lines = logged("json", `log.debug("hidden"); log.info("hello", { n: 3 }); log.error("bad");`);
  assert.equal(lines.length, 2);
  const [hello, bad] = lines.map((l) => JSON.parse(l));
  assert.equal(hello.level, "info");
  assert.equal(hello.service, "svc");
  assert.equal(hello.msg, "hello");
  assert.equal(hello.n, 3);
  assert.ok(!Number.isNaN(Date.parse(hello.time)));
  assert.equal(bad.level, "error");
});

test("secrets are replaced, at the top and one level down", () => {
  const [line] = logged(
    "json",
    `log.warn("call", { apiKey: "sk-live-123", headers: { authorization: "Bearer trp_abc" }, token: "t0k", other: "kept" });`,
  );
  assert.doesNotMatch(line, /sk-live-123|trp_abc|t0k/);
  const o = JSON.parse(line);
  assert.equal(o.apiKey, "[redacted]");
  assert.equal(o.headers.authorization, "[redacted]");
  assert.equal(o.other, "kept");
});

test("records made under a context carry its tenant and session, and only those", () => {
  const lines = logged(
    "json",
    `await context.with(withLogFields(ROOT_CONTEXT, { tenant: "acme", session_id: "s1" }), async () => {
       await new Promise((r) => setTimeout(r, 5));
       log.info("inside");
     });
     log.info("outside");`,
  );
  const [inside, outside] = lines.map((l) => JSON.parse(l));
  assert.equal(inside.tenant, "acme");
  assert.equal(inside.session_id, "s1");
  assert.equal(outside.tenant, undefined);
});

test("text: one plain line per record", () => {
  const [line] = logged("text", `log.warn("careful", { why: "because" });`);
  assert.match(line, /^\d{4}-\d\d-\d\dT[\d:.]+Z warn {2}svc: careful \{"why":"because"\}$/);
});

test("grpc-js's own log lines are the logger's JSON records, not its plain stderr lines", () => {
  const lines = logged(
    "json",
    `const { routeGrpcLogs } = await import(${JSON.stringify(GRPC_LOGS)});
     const grpc = (await import(${JSON.stringify(GRPC)})).default;
     routeGrpcLogs(log);
     grpc.experimental.log(grpc.logVerbosity.ERROR, "a listener failed:", 7);
     grpc.experimental.log(grpc.logVerbosity.INFO, "below grpc-js's own verbosity");`,
  );
  assert.equal(lines.length, 1, lines.join("\n"));
  const record = JSON.parse(lines[0]);
  assert.equal(record.level, "error");
  assert.equal(record.msg, "a listener failed: 7");
  assert.equal(record.component, "grpc-js");
});

test("Node's own warnings are the logger's records, not its \"(node:PID) Warning\" lines", () => {
  const lines = logged(
    "json",
    `const { routeNodeWarnings } = await import(${JSON.stringify(LOG)});
     routeNodeWarnings(log);
     process.emitWarning("an old API was used", { type: "DeprecationWarning", code: "DEP0999" });`,
  );
  assert.equal(lines.length, 1, lines.join("\n"));
  const record = JSON.parse(lines[0]);
  assert.equal(record.level, "warn");
  assert.equal(record.msg, "DeprecationWarning: an old API was used");
  assert.equal(record.component, "node");
  assert.equal(record.code, "DEP0999");
});

test("an unexpected failure is logged with its stack, cut to 4,000 characters; a thrown non-Error as its text", () => {
  const lines = logged(
    "json",
    `const { failure } = await import(${JSON.stringify(LOG)});
     function whereItBroke() { return new Error("broken"); }
     log.error("a", failure(whereItBroke()));
     log.error("b", failure(new Error("x".repeat(10000))));
     log.error("c", failure("plain text"));
     log.error("d", failure(undefined));`,
  ).map((l) => JSON.parse(l));
  assert.match(lines[0].error, /^Error: broken\n\s+at whereItBroke/);
  assert.equal(lines[1].error.length, 4000);
  assert.equal(lines[2].error, "plain text");
  assert.equal(lines[3].error, "undefined");
});
