// bench/provider-sdk: what calling OpenAI's kinds through the `openai` SDK costs against the plain
// HTTP poster it replaced (the baseline, same run; bench/support/plain-poster.ts). Both send over
// the runner's pooled fetch (pool-fetch.ts) to one loopback server streaming a chat completion of
// --tokens events, and both replies are read by the runner's SSE decoder, so the difference is the
// SDK's: building the request, its headers, its promise chain. Alternated rounds, --calls calls
// each, --parallel at a time. Figures per poster: CPU per call (this process's user+system time
// over the calls), p50 and p99 of a call (request to the done event); and the resident memory the
// SDKs add once loaded (a fresh process each, before and after `import("openai")` and
// `import("@anthropic-ai/sdk")`).
//
//   node dist/bench/provider-sdk.js [--calls 2000] [--parallel 16] [--tokens 50]
import { execFileSync } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { Agent } from "undici";
import { poolFetch, replyBody } from "../services/runner/providers/pool-fetch.js";
import { SseDecoder } from "../services/runner/providers/sse.js";
import { openaiPoster } from "../services/shared/models/openai-sdk.js";
import type { Fetch, ProviderPost } from "../services/shared/models/provider-post.js";
import { providerPoster } from "./support/plain-poster.js";
import { measure, pct } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    calls: { type: "string", default: "2000" },
    parallel: { type: "string", default: "16" },
    tokens: { type: "string", default: "50" },
  },
});
const CALLS = Number(values.calls);
const PARALLEL = Number(values.parallel);
const TOKENS = Number(values.tokens);
const ROUNDS = 3;

const event = (delta: Record<string, unknown>, finish: string | null) =>
  `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const reply =
  Array.from({ length: TOKENS }, (_, i) => event({ content: `tok${i} ` }, null)).join("") +
  event({}, "stop") +
  "data: [DONE]\n\n";

const server = http.createServer((req, res) => {
  req.resume().on("end", () => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(reply);
  });
});
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const endpoint = { baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, apiKey: "k" };
const body = { model: "m", messages: [{ role: "user", content: "hi" }], stream: true };

/** One call: POST, then every event of the reply through the decoder, to the end marker. */
async function call(post: ProviderPost): Promise<void> {
  const response = await post("/chat/completions", body, new AbortController().signal);
  const decoder = new SseDecoder();
  let done = false;
  for await (const bytes of replyBody(response)!) for (const e of decoder.push(bytes)) done ||= e.data === "[DONE]";
  if (!done) throw new Error("a reply ended before [DONE]");
}

async function round(make: (fetch: Fetch) => ProviderPost) {
  const pool = new Agent({ connections: PARALLEL, keepAliveTimeout: 30_000 });
  const post = make(poolFetch(pool) as Fetch);
  for (let i = 0; i < 50; i++) await call(post); // warm: the SDK loaded, connections made
  const cpu0 = process.cpuUsage();
  const { p50, p99 } = await measure(() => call(post), CALLS, PARALLEL);
  const cpu = process.cpuUsage(cpu0);
  await pool.close();
  return { cpuUsPerCall: (cpu.user + cpu.system) / CALLS, p50, p99 };
}

const posters = { sdk: openaiPoster, http: providerPoster } as const;
const results: Record<keyof typeof posters, Awaited<ReturnType<typeof round>>[]> = { sdk: [], http: [] };
for (let r = 0; r < ROUNDS; r++)
  for (const name of r % 2 === 0 ? (["http", "sdk"] as const) : (["sdk", "http"] as const))
    results[name].push(await round((fetch) => posters[name](endpoint, fetch)));
server.close();

const middle = (xs: number[]) => pct(xs, 50);
const of = (name: keyof typeof posters) => ({
  cpu: middle(results[name].map((r) => r.cpuUsPerCall)),
  p50: middle(results[name].map((r) => r.p50)),
  p99: middle(results[name].map((r) => r.p99)),
});
const sdk = of("sdk");
const plain = of("http");

// Each SDK's resident cost: a fresh process, before and after loading it.
const loadMb = (pkg: string) =>
  execFileSync(
    process.execPath,
    [
      "--expose-gc",
      "--input-type=module",
      "-e",
      `globalThis.gc(); const a = process.memoryUsage().rss; await import(${JSON.stringify(pkg)}); globalThis.gc(); console.log(((process.memoryUsage().rss - a) / 1048576).toFixed(1));`,
    ],
    { encoding: "utf8" },
  ).trim();
const rss = loadMb("openai");
const anthropicRss = loadMb("@anthropic-ai/sdk");

for (const [name, r] of [
  ["openai SDK", sdk],
  ["plain HTTP poster (baseline)", plain],
] as const)
  console.log(
    `${name}: ${ROUNDS} rounds of ${CALLS} calls, ${PARALLEL} at a time, ${TOKENS} events each: ${r.cpu.toFixed(0)} µs CPU per call, p50 ${r.p50.toFixed(2)} ms, p99 ${r.p99.toFixed(2)} ms`,
  );
console.log(`loading the openai SDK adds ${rss} MB resident; @anthropic-ai/sdk ${anthropicRss} MB`);
console.log(
  `RESULT sdk_cpu_us_per_call=${sdk.cpu.toFixed(0)} http_cpu_us_per_call=${plain.cpu.toFixed(0)} cpu_ratio=${(sdk.cpu / plain.cpu).toFixed(2)} sdk_p50_ms=${sdk.p50.toFixed(2)} http_p50_ms=${plain.p50.toFixed(2)} openai_load_mb=${rss} anthropic_load_mb=${anthropicRss}`,
);
