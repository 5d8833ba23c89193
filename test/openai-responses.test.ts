// The Responses API (openai-responses.ts) driven by the official `openai` SDK and by the OpenAI
// Agents SDK's default model, which speaks it: responses whole and streamed with the events the
// API reference lists, GET (and its replayed stream), previous_response_id, instructions,
// function tools as client tools, background runs and their cancel, store: false, and the
// errors the SDK raises as its classes. Replies come from the scripted model
// (docs/scripted-model.md).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled } from "@openai/agents";
import { ASKING_WEATHER, WEATHER_PARAMETERS, weatherTool } from "./helpers/weather-tool.js";
import { grpcCode, Status } from "../services/shared/errors.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
let client: OpenAI;

before(async () => {
  stack = await startStack({ env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" } });
  client = new OpenAI({ baseURL: `http://${stack.addr.http}/v1`, apiKey: stack.apiKey, maxRetries: 0 });
});
after(async () => {
  await stack?.stop();
});

const model = "troupe/main";
const codeOf = (p: Promise<unknown>) => p.then(() => Status.OK, grpcCode);
const textOf = (r: OpenAI.Responses.Response) =>
  r.output
    .flatMap((i) => (i.type === "message" ? i.content : []))
    .map((c) => (c.type === "output_text" ? c.text : ""))
    .join("");

/** Every event of a streamed response, in order. */
async function eventsOf(stream: AsyncIterable<OpenAI.Responses.ResponseStreamEvent>) {
  const out: OpenAI.Responses.ResponseStreamEvent[] = [];
  for await (const e of stream) out.push(e);
  return out;
}

const weather: OpenAI.Responses.FunctionTool = {
  type: "function",
  name: "get_weather",
  description: "The weather in a city",
  parameters: WEATHER_PARAMETERS as never,
  strict: true,
};
const asking = ASKING_WEATHER;

describe("the Responses API, through the openai SDK", () => {
  test("a response, not streamed: the response object, its output text and usage; GET returns it", async () => {
    const r = await client.responses.create({ model, input: "!tokens 4" });
    assert.equal(r.object, "response");
    assert.equal(r.status, "completed");
    assert.equal(r.model, model);
    assert.match(r.id, /^resp_/);
    assert.equal(r.output.length, 1);
    const [item] = r.output;
    assert.equal(item.type, "message");
    assert.equal(item.type === "message" && item.role, "assistant");
    assert.equal(r.output_text.trim(), "t1 t2 t3 t4", "the SDK's own output_text");
    assert.ok(r.usage && r.usage.output_tokens > 0 && r.usage.input_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    const again = await client.responses.retrieve(r.id);
    assert.equal(again.status, "completed");
    assert.equal(textOf(again), textOf(r));
    assert.deepEqual(again.usage, r.usage);
    assert.equal(again.output[0].id, r.output[0].id);
  });

  test("streamed: the reference's events in order with rising sequence numbers; GET replays them", async () => {
    const events = await eventsOf(await client.responses.create({ model, input: "!tokens 5 rate=50", stream: true }));
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 4), [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
    ]);
    assert.deepEqual(types.slice(-4), [
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    assert.deepEqual(
      events.map((e) => e.sequence_number),
      events.map((_, i) => i),
    );
    const deltas = events.flatMap((e) => (e.type === "response.output_text.delta" ? [e.delta] : []));
    assert.ok(deltas.length >= 5, `${deltas.length} deltas`);
    const done = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    assert.equal(deltas.join(""), textOf(done.response));
    assert.equal(textOf(done.response).trim(), "t1 t2 t3 t4 t5");
    // A stream of the same response read again after event 3: the same events from 4 on.
    const replay = await eventsOf(
      await client.responses.retrieve(done.response.id, { stream: true, starting_after: 3 }),
    );
    assert.deepEqual(replay, events.slice(4));
  });

  test("previous_response_id continues the conversation; instructions are the response's own; no branching", async () => {
    const first = await client.responses.create({ model, input: "My name is Ada." });
    const system = await client.responses.create({
      model,
      input: "!system",
      instructions: "Be brief.",
      previous_response_id: first.id,
    });
    assert.match(system.output_text, /Be brief\./, "instructions reach the model");
    assert.equal(system.previous_response_id, first.id);
    const second = await client.responses.create({ model, input: "!system", previous_response_id: system.id });
    assert.doesNotMatch(second.output_text, /Be brief\./, "as the reference says: not carried over");
    const third = await client.responses.create({ model, input: "!first", previous_response_id: second.id });
    assert.match(third.output_text, /My name is Ada\./, "the model saw the conversation from its start");
    // `first` was continued already: a session does not branch.
    await assert.rejects(
      client.responses.create({ model, input: "hello", previous_response_id: first.id }),
      (e: unknown) =>
        e instanceof OpenAI.BadRequestError &&
        /does not branch/.test(e.message) &&
        e.code === "previous_response_not_latest",
    );
  });

  test("input items are the conversation when no response is named", async () => {
    const r = await client.responses.create({
      model,
      input: [
        { role: "developer", content: "Speak plainly." },
        { role: "user", content: [{ type: "input_text", text: "I am Grace." }] },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "Hello Grace." }] },
        { role: "user", content: "!first" },
      ] as never,
    });
    assert.match(r.output_text, /I am Grace\./);
  });

  test("function tools: a call ends the response; its output continues the run, streamed or not", async () => {
    const first = await client.responses.create({ model, input: asking, tools: [weather] });
    assert.equal(first.status, "completed");
    const call = first.output.find((i) => i.type === "function_call") as OpenAI.Responses.ResponseFunctionToolCall;
    assert.ok(call, JSON.stringify(first.output));
    assert.equal(call.name, "get_weather");
    assert.deepEqual(JSON.parse(call.arguments), { city: "Oslo" });
    const stream = await client.responses.create({
      model,
      previous_response_id: first.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny, 21 C" }],
      tools: [weather],
      stream: true,
    });
    const events = await eventsOf(stream);
    const done = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    assert.equal(done.type, "response.completed");
    assert.match(textOf(done.response), /Tool results: sunny, 21 C/);
    const fetched = await client.responses.retrieve(done.response.id);
    assert.equal(textOf(fetched), textOf(done.response));

    // Streamed, a call comes as an item and its arguments as deltas.
    const streamed = await eventsOf(
      await client.responses.create({ model, input: asking, tools: [weather], stream: true }),
    );
    const args = streamed.flatMap((e) => (e.type === "response.function_call_arguments.delta" ? [e.delta] : []));
    assert.deepEqual(JSON.parse(args.join("")), { city: "Oslo" });
    assert.ok(streamed.some((e) => e.type === "response.function_call_arguments.done"));
    assert.equal(streamed.at(-1)?.type, "response.completed");
  });

  test("background: answered queued, then read with GET; a cancel stops the run", async () => {
    const quick = await client.responses.create({ model, input: "!tokens 3", background: true });
    assert.ok(quick.status === "queued" || quick.status === "in_progress", quick.status);
    assert.equal(quick.background, true);
    const done = await waitFor("the background response", async () => {
      const r = await client.responses.retrieve(quick.id);
      return r.status === "completed" && r;
    });
    assert.equal(done.output_text.trim(), "t1 t2 t3");

    const slow = await client.responses.create({ model, input: "!tokens 400 rate=40", background: true });
    await waitFor("tokens flowing", async () => textOf(await client.responses.retrieve(slow.id)).length > 0);
    const cancelled = await client.responses.cancel(slow.id);
    assert.equal(cancelled.status, "cancelled");
    const later = await client.responses.retrieve(slow.id);
    assert.equal(later.status, "cancelled");
    assert.ok(textOf(later).split(" ").length < 400, "the run stopped");
  });

  test("store: false: the response is answered, then nothing of it is kept", async () => {
    const { data: r, response } = await client.responses
      .create({ model, input: "!tokens 2", store: false })
      .withResponse();
    assert.equal(r.output_text.trim(), "t1 t2");
    assert.equal((r as { store?: boolean }).store, false);
    await assert.rejects(client.responses.retrieve(r.id), OpenAI.NotFoundError);
    const session = response.headers.get("x-troupe-session") ?? "";
    assert.equal(await codeOf(stack.gateway.getHistory({ sessionId: session })), Status.NOT_FOUND);
  });

  test("the Agents SDK's default model (the Responses API) runs an agent, its tool in this process", async () => {
    setTracingDisabled(true);
    setDefaultOpenAIClient(client as never);
    const cities: string[] = [];
    const getWeather = weatherTool(cities);
    const agent = new Agent({
      name: "weather-asker",
      instructions: "Answer with the weather.",
      model,
      tools: [getWeather],
    });
    const result = await run(agent, asking);
    assert.deepEqual(cities, ["Oslo"], "the SDK ran the tool once, here");
    assert.match(String(result.finalOutput), /Tool results: foggy in Oslo/);
    // Streamed, as a chat UI runs it.
    const streamed = await run(agent, asking, { stream: true });
    let text = "";
    for await (const e of streamed.toTextStream()) text += e;
    await streamed.completed;
    assert.match(text, /Tool results: foggy in Oslo/);
    assert.deepEqual(cities, ["Oslo", "Oslo"]);
    // The SDK's server-kept conversation: only the new input goes, previous_response_id the rest.
    const next = await run(agent, "!first", { previousResponseId: result.lastResponseId });
    assert.equal(String(next.finalOutput).trim(), asking);
  });

  test("bad requests get OpenAI's errors, which the SDK raises as its classes; strangers see nothing", async () => {
    const cases: [() => Promise<unknown>, new (...a: never[]) => Error, RegExp][] = [
      [
        () => client.responses.create({ model, input: "hi", top_logprobs: 3 } as never),
        OpenAI.BadRequestError,
        /top_logprobs/,
      ],
      [
        () => client.responses.create({ model, input: "hi", tools: [{ type: "web_search" }] } as never),
        OpenAI.BadRequestError,
        /function tools only/,
      ],
      [
        () => client.responses.create({ model, input: [{ type: "reasoning", summary: [] }] } as never),
        OpenAI.BadRequestError,
        /input\[0\]/,
      ],
      [() => client.responses.create({ model, input: [] } as never), OpenAI.BadRequestError, /input/],
      [
        () => client.responses.create({ model, input: "hi", background: true, store: false }),
        OpenAI.BadRequestError,
        /background/,
      ],
      [() => client.responses.create({ model: "gpt-4o", input: "hi" }), OpenAI.NotFoundError, /does not exist/],
      [
        () => client.responses.create({ model, input: "hi", previous_response_id: "resp_nope" }),
        OpenAI.NotFoundError,
        /not found/,
      ],
      [() => client.responses.retrieve("resp_nope"), OpenAI.NotFoundError, /not found/],
      [() => client.responses.retrieve("%E0%A4%A"), OpenAI.NotFoundError, /not found/],
    ];
    for (const [i, [call, kind, message]] of cases.entries())
      await assert.rejects(call(), (e: unknown) => {
        assert.ok(e instanceof kind && message.test((e as Error).message), `case ${i}: ${e}`);
        return true;
      });

    // Another tenant's key: the response and its conversation are missing to it, as unknown ones are.
    const mine = await client.responses.create({ model, input: "!tokens 1" });
    const key = await stack.keyFor("acme", "eve");
    const stranger = new OpenAI({ baseURL: `http://${stack.addr.http}/v1`, apiKey: key, maxRetries: 0 });
    await assert.rejects(stranger.responses.retrieve(mine.id), OpenAI.NotFoundError);
    await assert.rejects(stranger.responses.cancel(mine.id), OpenAI.NotFoundError);
    await assert.rejects(
      stranger.responses.create({ model, input: "hi", previous_response_id: mine.id }),
      OpenAI.NotFoundError,
    );
    // The service goes on serving.
    assert.equal((await client.responses.create({ model, input: "!tokens 1" })).status, "completed");
  });
});
