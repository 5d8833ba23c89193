// bench/model-reply: model calls made one after another by the runner's client over HTTPS, as a
// session's turns make them, against a loopback provider whose streamed reply ends in one of two
// ways (services/runner/providers/reply-rest.ts says why it matters):
// - "late end": the final event ([DONE]) goes out, then the end of the body --gap ms later, as a
//   server or proxy that flushes each event as it comes and ends the response afterwards sends it;
// - "together" (the baseline, same run): the final event and the end of the body in one write.
// Figures per mode (two rounds of each, alternated; a fresh pool each round): a call's p50 (the
// mean of the rounds') and p99 (the larger), request to the done chunk, and the TLS connections
// the provider accepted. A late end should cost what the baseline costs: a connection a round.
//
//   node dist/bench/model-reply.js [--calls 300] [--gap 5]
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import https from "node:https";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { OpenAIModelClient } from "../services/runner/providers/chat-completions-model.js";
import { selfSigned } from "../test/helpers/certs.js";
import { pct } from "./support/stats.js";

const { values } = parseArgs({
  options: { calls: { type: "string", default: "300" }, gap: { type: "string", default: "5" } },
});
const CALLS = Number(values.calls);
const GAP_MS = Number(values.gap);
const WARMUP = 20;

// The runner's pool trusts the system's roots and NODE_EXTRA_CA_CERTS, which Node reads at start:
// so the benchmark runs itself again with its own certificate named there.
if (!process.env.BENCH_MODEL_REPLY_CERT) {
  const dir = mkdtempSync(path.join(os.tmpdir(), "bench-model-reply-"));
  try {
    const { cert } = selfSigned(dir, "provider", "127.0.0.1", "IP:127.0.0.1");
    const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), ...process.argv.slice(2)], {
      stdio: "inherit",
      env: { ...process.env, NODE_EXTRA_CA_CERTS: cert, BENCH_MODEL_REPLY_CERT: cert },
    });
    process.exitCode = child.status ?? 1;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
} else await main(process.env.BENCH_MODEL_REPLY_CERT);

async function main(certFile: string): Promise<void> {
  const chunk = (delta: Record<string, unknown>, finish: string | null) =>
    `data: ${JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
  let lateEnd = true;
  let connections = 0;
  const server = https.createServer(
    { cert: readFileSync(certFile), key: readFileSync(certFile.replace(/\.pem$/, ".key")) },
    (req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(chunk({ role: "assistant", content: "one two three" }, null) + chunk({}, "stop"));
        if (!lateEnd) return void res.end("data: [DONE]\n\n");
        res.write("data: [DONE]\n\n");
        setTimeout(() => res.end(), GAP_MS);
      });
    },
  );
  server.on("secureConnection", () => connections++);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const baseUrl = `https://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  const request = { model: "m", messages: [{ role: "user" as const, content: "hi" }], tools: [] };

  const run = async (late: boolean) => {
    lateEnd = late;
    connections = 0;
    const client = new OpenAIModelClient({ baseUrl, apiKey: "k" });
    const times: number[] = [];
    for (let i = 0; i < WARMUP + CALLS; i++) {
      const t0 = performance.now();
      let done = false;
      for await (const c of client.stream(request, new AbortController().signal)) done ||= c.type === "done";
      if (!done) throw new Error("a call ended without its done chunk");
      if (i >= WARMUP) times.push(performance.now() - t0);
      // The next turn's call comes after the reply is handled, and after the body's late end.
      await new Promise((r) => setTimeout(r, GAP_MS * 2));
    }
    await client.close();
    return { p50: pct(times, 50), p99: pct(times, 99), connections };
  };

  // Alternated, twice each, so that neither mode alone has the process's warm-up.
  const rounds = [await run(false), await run(true), await run(false), await run(true)];
  const merge = (rs: typeof rounds) => ({
    p50: (rs[0].p50 + rs[1].p50) / 2,
    p99: Math.max(rs[0].p99, rs[1].p99),
    connections: rs[0].connections + rs[1].connections,
  });
  const together = merge([rounds[0], rounds[2]]);
  const late = merge([rounds[1], rounds[3]]);
  server.close();
  const line = (name: string, r: typeof late) =>
    `${name}: 2 x ${CALLS} calls, p50 ${r.p50.toFixed(2)} ms, p99 ${r.p99.toFixed(2)} ms, ${r.connections} TLS connection(s)`;
  console.log(line(`late end (body ends ${GAP_MS} ms after [DONE])`, late));
  console.log(line("together (baseline: [DONE] and the end in one write)", together));
  console.log(
    `RESULT late_end_p50_ms=${late.p50.toFixed(2)} together_p50_ms=${together.p50.toFixed(2)} ratio=${(late.p50 / together.p50).toFixed(2)} late_end_connections=${late.connections} together_connections=${together.connections}`,
  );
}
