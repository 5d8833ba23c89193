// bench/reply-read: what the runner spends reading a streamed model reply, per token, beside the
// least any reader must. R replies at once from the scripted model server, each T tokens at a
// real model's pace (`!bench T rate=30`, bench/stream's paced mode), read in this process:
// - troupe: the runner's own OpenAI client (chat-completions-model.ts: its undici pool, the SSE
//   decoder, each chunk's JSON, the final-event handover of reply-rest.ts), chunks as the agent
//   loop takes them;
// - baseline (the same run): undici's request, and the events split and parsed by hand, as
//   bench/stream-floor's runner relay reads them (support/floor-relay.ts).
// Rounds alternate; figures are medians of this process's CPU per token (the model server's own
// is not counted).
//
//   node dist/bench/reply-read.js [--replies 300] [--tokens 150] [--rate 30] [--rounds 4]
import { parseArgs } from "node:util";
import { Agent } from "undici";
import { OpenAIModelClient } from "../services/runner/providers/chat-completions-model.js";
import { startStack } from "../test/helpers/stack.js";
import { streamReply } from "./support/floor-relay.js";
import { median } from "./support/stats.js";

const { values } = parseArgs({
  options: {
    replies: { type: "string", default: "300" },
    tokens: { type: "string", default: "150" },
    rate: { type: "string", default: "30" },
    rounds: { type: "string", default: "4" },
  },
});
const REPLIES = Number(values.replies);
const TOKENS = Number(values.tokens);
const PROMPT = `!bench ${TOKENS} rate=${Number(values.rate)}`;

/** Reads REPLIES replies at once; µs of this process's CPU per token, and the tokens read. */
async function round(read: () => Promise<number>): Promise<{ usPerToken: number; tokens: number }> {
  const before = process.cpuUsage();
  const counts = await Promise.all(Array.from({ length: REPLIES }, read));
  const used = process.cpuUsage(before);
  const tokens = counts.reduce((a, b) => a + b, 0);
  return { usPerToken: (used.user + used.system) / tokens, tokens };
}

const stack = await startStack({ services: ["model-server"] });
try {
  const origin = `http://${stack.addr["model-server"]}`;
  const client = new OpenAIModelClient({ baseUrl: `${origin}/v1`, apiKey: "bench" });
  const troupe = async (): Promise<number> => {
    let n = 0;
    const request = { model: "scripted-1", messages: [{ role: "user" as const, content: PROMPT }], tools: [] };
    for await (const chunk of client.stream(request, new AbortController().signal)) if (chunk.type === "text") n++;
    return n;
  };
  const pool = new Agent({ keepAliveTimeout: 60_000 });
  const baseline = async (): Promise<number> => {
    let n = 0;
    await streamReply(pool, origin, PROMPT, () => (n++, true));
    return n;
  };
  await round(troupe); // JIT and connections, both ways
  await round(baseline);
  const figures = { troupe: [] as number[], baseline: [] as number[] };
  for (let r = 0; r < Number(values.rounds); r++) {
    for (const [name, read] of [
      ["troupe", troupe],
      ["baseline", baseline],
    ] as const) {
      const { usPerToken, tokens } = await round(read);
      if (tokens !== REPLIES * TOKENS) throw new Error(`${name} read ${tokens} tokens of ${REPLIES * TOKENS}`);
      figures[name].push(usPerToken);
    }
  }
  const t = median(figures.troupe);
  const b = median(figures.baseline);
  console.log(`reply-read: ${REPLIES} replies at once, ${TOKENS} tokens each, ${PROMPT}`);
  console.log(`troupe's client: ${figures.troupe.map((x) => x.toFixed(2)).join(", ")} µs of CPU per token`);
  console.log(`baseline (undici request, split and parse): ${figures.baseline.map((x) => x.toFixed(2)).join(", ")} µs`);
  console.log(
    `RESULT troupe_us_per_token=${t.toFixed(2)} baseline_us_per_token=${b.toFixed(2)} ratio=${(t / b).toFixed(2)}`,
  );
  await pool.close();
} finally {
  await stack.stop();
}
