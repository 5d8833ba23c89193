// undici's Agent loaded alone (services/shared/net/undici-agent.ts): it sends a request and reads the
// reply, and a process that uses it, the runner's model pool among them, has not loaded the rest
// of undici (its index, fetch, WebSocket, mocks). Fails if an undici upgrade moves the files it names.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";

const moduleUrl = (file: string) => JSON.stringify(new URL(`../../services/${file}`, import.meta.url).href);

/** Runs `body` (an ES module's top level) in a fresh process: what it printed last, and the undici files it loaded. */
function runProbe(body: string): { result: unknown; files: string[] } {
  const script = `
    import { registerHooks } from "node:module";
    const files = new Set();
    registerHooks({ resolve(spec, ctx, next) {
      const r = next(spec, ctx);
      const m = /node_modules\\/undici\\/(.*)$/.exec(r.url);
      if (m) files.add(m[1]);
      return r;
    } });
    const result = await (async () => { ${body} })();
    console.log(JSON.stringify({ result, files: [...files] }));
  `;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  return JSON.parse(out.trim().split("\n").at(-1)!) as { result: unknown; files: string[] };
}

const restOfUndici = (files: string[]) =>
  files.filter((f) => f === "index.js" || f.startsWith("lib/web/") || f.startsWith("lib/mock/"));

test("undici's Agent alone sends a request and reads its reply", () => {
  const { result, files } = runProbe(`
    const http = await import("node:http");
    const server = http.createServer((req, res) => res.end(req.method + " " + req.url + " " + req.headers["x-probe"]));
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const { undiciAgent } = await import(${moduleUrl("shared/net/undici-agent.js")});
    const Agent = undiciAgent();
    const agent = new Agent({ connections: 1 });
    const res = await agent.request({
      origin: "http://127.0.0.1:" + server.address().port, path: "/a?b=1", method: "POST",
      headers: { "x-probe": "yes" }, body: "x",
    });
    const text = await res.body.text();
    await agent.close();
    server.close();
    return [res.statusCode, text, undiciAgent() === Agent];
  `);
  assert.deepEqual(result, [200, "POST /a?b=1 yes", true]);
  assert.ok(files.includes("lib/dispatcher/agent.js"), `loaded: ${files.join(", ")}`);
  assert.deepEqual(restOfUndici(files), []);
  assert.ok(files.length < 40, `${files.length} undici modules loaded`);
});

test("the runner's model pool loads undici's Agent, not the rest of undici", () => {
  const { result, files } = runProbe(`
    const { connectionPool } = await import(${moduleUrl("runner/providers/model.js")});
    const pool = connectionPool({});
    await pool.close();
    return typeof pool.request;
  `);
  assert.equal(result, "function");
  assert.deepEqual(restOfUndici(files), []);
});
