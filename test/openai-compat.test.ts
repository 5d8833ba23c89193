// The OpenAI-compatible endpoint (openai-compat.ts) driven by the official `openai` SDK, as any
// tool built on it would: replies streamed and not, usage, the agent's tools running server-side
// with their progress as content, sessions kept by `user` or named by header, and the errors the
// SDK turns into its own classes (AuthenticationError, NotFoundError, BadRequestError).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { Agent, OpenAIChatCompletionsModel, run, setTracingDisabled } from "@openai/agents";
import { weatherTool } from "./helpers/weather-tool.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
let client: OpenAI;

before(async () => {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-openai-"));
  await mkdir(path.join(dataDir, "agents", "helper"), { recursive: true });
  await writeFile(path.join(dataDir, "agents", "helper", "agent.json"), "{}");
  stack = await startStack({ dataDir, env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" } });
  client = new OpenAI({ baseURL: `http://${stack.addr.http}/v1`, apiKey: stack.apiKey, maxRetries: 0 });
});
after(async () => {
  await stack?.stop();
});

const ask = (content: string, extra: Partial<OpenAI.ChatCompletionCreateParamsNonStreaming> = {}) =>
  client.chat.completions.create({ model: "troupe/main", messages: [{ role: "user", content }], ...extra });

describe("the OpenAI-compatible endpoint, through the openai SDK", () => {
  test("a reply, not streamed: the chat completion object with usage and the session's id", async () => {
    const { data, response } = await ask("!tokens 4").withResponse();
    assert.equal(data.object, "chat.completion");
    assert.equal(data.model, "troupe/main");
    assert.equal(data.choices[0].message.role, "assistant");
    assert.equal(data.choices[0].message.content?.trim(), "t1 t2 t3 t4");
    assert.equal(data.choices[0].finish_reason, "stop");
    assert.ok(data.usage && data.usage.completion_tokens > 0 && data.usage.prompt_tokens > 0);
    assert.equal(data.usage.total_tokens, data.usage.prompt_tokens + data.usage.completion_tokens);
    const session = response.headers.get("x-troupe-session") ?? "";
    const history = await stack.gateway.getHistory({ sessionId: session });
    assert.deepEqual(
      history.messages.map((m) => m.text.trim()),
      ["!tokens 4", "t1 t2 t3 t4"],
    );
  });

  test("a reply streamed: chunks as they come, the finish reason, then usage", async () => {
    const stream = await client.chat.completions.create({
      model: "troupe/main",
      messages: [{ role: "user", content: "!tokens 6" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let chunks = 0;
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, "chat.completion.chunk");
      chunks++;
      text += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    assert.equal(text.trim(), "t1 t2 t3 t4 t5 t6");
    assert.ok(chunks >= 3, `${chunks} chunks`);
    assert.equal(finish, "stop");
    assert.ok(usage && usage.completion_tokens > 0);
  });

  test("the agent's tools run server-side; with the progress header their calls stream as content", async () => {
    const stream = await client.chat.completions.create(
      { model: "troupe/main", messages: [{ role: "user", content: "$ echo from-the-sandbox" }], stream: true },
      { headers: { "x-troupe-tool-progress": "1" } },
    );
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
    assert.match(text, /\[exec \{"command": ?"echo from-the-sandbox"\}\]\n\[done: [\s\S]*from-the-sandbox/, text);
    assert.match(text, /Tool results: [\s\S]*from-the-sandbox/);
    const quiet = await ask("$ echo quietly");
    assert.doesNotMatch(quiet.choices[0].message.content ?? "", /\[exec/);
  });

  test("`user` keeps one session per user; the header names one", async () => {
    const first = await ask("!tokens 1", { user: "ada" }).withResponse();
    const second = await ask("!tokens 2", { user: "ada" }).withResponse();
    const other = await ask("!tokens 3", { user: "grace" }).withResponse();
    const sessionOf = (r: { response: Response }) => r.response.headers.get("x-troupe-session");
    assert.equal(sessionOf(first), sessionOf(second));
    assert.notEqual(sessionOf(first), sessionOf(other));
    const named = await client.chat.completions.create(
      { model: "troupe/main", messages: [{ role: "user", content: "!tokens 2" }] },
      { headers: { "x-troupe-session": sessionOf(other)! } },
    );
    assert.equal(named.choices[0].message.content?.trim(), "t1 t2");
    const history = await stack.gateway.getHistory({ sessionId: sessionOf(other)! });
    assert.deepEqual(
      history.messages.map((m) => m.text.trim()),
      ["!tokens 3", "t1 t2 t3", "!tokens 2", "t1 t2"],
    );
  });

  test("without a session, the request's messages are the conversation: nothing is lost between requests", async () => {
    // As Open WebUI or LangChain's ChatOpenAI talk: the whole history each time, no session.
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: "system", content: "Answer as a pirate would." },
      { role: "user", content: "My name is Ada." },
    ];
    const first = await client.chat.completions.create({ model: "troupe/main", messages }).withResponse();
    assert.equal(first.response.headers.get("x-troupe-history"), "client");
    messages.push(first.data.choices[0].message, { role: "user", content: "!first" });
    const second = await client.chat.completions.create({ model: "troupe/main", messages }).withResponse();
    // The model saw the conversation from its start, not only the last message.
    assert.match(second.data.choices[0].message.content ?? "", /My name is Ada\./);
    assert.notEqual(second.response.headers.get("x-troupe-session"), first.response.headers.get("x-troupe-session"));
    const held = await stack.gateway.getHistory({ sessionId: second.response.headers.get("x-troupe-session")! });
    assert.deepEqual(
      held.messages.map((m) => [Role[m.role], m.text.trim()]),
      [
        ["USER", "My name is Ada."],
        ["ASSISTANT", "You said: My name is Ada."],
        ["USER", "!first"],
        ["ASSISTANT", second.data.choices[0].message.content?.trim()],
      ],
    );
    // The client's system message is the run's instruction, below the agent's own prompt.
    const system = await client.chat.completions.create({
      model: "troupe/main",
      messages: [messages[0], { role: "user", content: "!system" }],
    });
    assert.match(system.choices[0].message.content ?? "", /Answer as a pirate would\./);
    // An image as a data URL goes with the message (to a vision model; kept in the history).
    const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";
    const pictured = await client.chat.completions
      .create({
        model: "troupe/main",
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "what is this?" },
              { type: "image_url", image_url: { url: `data:image/png;base64,${png}` } },
            ],
          },
        ],
      })
      .withResponse();
    const withImage = await stack.gateway.getHistory({ sessionId: pictured.response.headers.get("x-troupe-session")! });
    assert.equal(withImage.messages[0].images[0]?.mimeType, "image/png");
  });

  test("a named session holds the history: earlier messages that differ from it are a 400", async () => {
    const history: OpenAI.ChatCompletionMessageParam[] = [
      { role: "user", content: "one" },
      { role: "assistant", content: "You said: one" },
      { role: "user", content: "two" },
    ];
    // A new session takes the request's earlier messages as its history.
    const first = await client.chat.completions
      .create({ model: "troupe/main", messages: history, user: "kept-history" })
      .withResponse();
    assert.equal(first.response.headers.get("x-troupe-history"), "session");
    const session = first.response.headers.get("x-troupe-session")!;
    history.push(first.data.choices[0].message, { role: "user", content: "three" });
    // The whole history again, or only the new message: both continue it.
    await client.chat.completions.create({ model: "troupe/main", messages: history, user: "kept-history" });
    await client.chat.completions.create({
      model: "troupe/main",
      messages: [{ role: "user", content: "four" }],
      user: "kept-history",
    });
    const held = await stack.gateway.getHistory({ sessionId: session });
    assert.deepEqual(
      held.messages.filter((m) => m.role === Role.USER).map((m) => m.text),
      ["one", "two", "three", "four"],
    );
    // A history that is not the session's is refused, naming what differs; nothing is added.
    await assert.rejects(
      client.chat.completions.create({
        model: "troupe/main",
        messages: [
          { role: "user", content: "four" },
          { role: "assistant", content: "something else" },
          { role: "user", content: "five" },
        ],
        user: "kept-history",
      }),
      (e: unknown) =>
        e instanceof OpenAI.BadRequestError &&
        e.code === "conversation_mismatch" &&
        /do not continue session .*earlier message 2 \(assistant\)/.test(e.message),
    );
    assert.equal((await stack.gateway.getHistory({ sessionId: session })).messages.length, held.messages.length);
    // Over the API: history is taken only by a session without messages.
    await assert.rejects(
      stack.gateway.createSession({ sessionId: session, agentId: "main", history: [{ role: Role.USER, text: "x" }] }),
      /INVALID_ARGUMENT: session .* has messages: history is taken only by a session without any/,
    );
  });

  test("temperature and max_tokens reach the model; what a run cannot do is a 400 naming it", async () => {
    const params = async (extra: Partial<OpenAI.ChatCompletionCreateParamsNonStreaming>) =>
      (await ask("!params", extra)).choices[0].message.content?.trim();
    // The agent's own (no temperature; 4096 tokens) unless the request says otherwise.
    assert.equal(await params({}), "temperature=- max_tokens=4096");
    assert.equal(await params({ temperature: 0.3, max_tokens: 77 }), "temperature=0.3 max_tokens=77");
    assert.equal(await params({ max_completion_tokens: 99 }), "temperature=- max_tokens=99");
    // A library's defaults ask for nothing and pass.
    assert.equal(
      await params({ n: 1, top_p: 1, response_format: { type: "text" }, parallel_tool_calls: true }),
      "temperature=- max_tokens=4096",
    );
    for (const [extra, param] of [
      [{ top_p: 0.5 }, "top_p"],
      [{ stop: ["END"] }, "stop"],
      [{ seed: 7 }, "seed"],
      [{ response_format: { type: "json_object" } }, "response_format"],
      [{ n: 2 }, "n"],
      [{ logprobs: true }, "logprobs"],
      [{ temperature: 3 }, "temperature"],
      [{ max_tokens: 0 }, "max_tokens"],
    ] as const)
      await assert.rejects(
        ask("hi", extra as Partial<OpenAI.ChatCompletionCreateParamsNonStreaming>),
        (e: unknown) => e instanceof OpenAI.BadRequestError && e.param === param,
        param,
      );
  });

  test("models: the default agent and each agent folder", async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepEqual(ids, ["troupe/helper", "troupe/main"]);
    assert.equal((await client.models.retrieve("troupe/helper")).owned_by, "troupe");
    const helper = await client.chat.completions.create({
      model: "troupe/helper",
      messages: [{ role: "user", content: "!tokens 2" }],
    });
    assert.equal(helper.choices[0].message.content?.trim(), "t1 t2");
  });

  test("bad requests get OpenAI's errors, which the SDK raises as its classes", async () => {
    const bad = new OpenAI({ baseURL: `http://${stack.addr.http}/v1`, apiKey: "not-a-key", maxRetries: 0 });
    await assert.rejects(
      bad.chat.completions.create({ model: "troupe/main", messages: [{ role: "user", content: "hi" }] }),
      (e: unknown) => e instanceof OpenAI.AuthenticationError && e.status === 401,
    );
    await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
    // The key first, as OpenAI checks it: a bad key with a bad request is a 401, not a 400.
    await assert.rejects(
      bad.chat.completions.create({ model: "gpt-4o", messages: [] }),
      (e: unknown) => e instanceof OpenAI.AuthenticationError && e.status === 401,
    );
    const keyless = await fetch(`http://${stack.addr.http}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{nope",
    });
    assert.equal(keyless.status, 401);
    const cases: [Partial<OpenAI.ChatCompletionCreateParamsNonStreaming>, new (...a: never[]) => Error, RegExp][] = [
      [{ model: "gpt-4o" }, OpenAI.NotFoundError, /model `gpt-4o` does not exist/],
      [{ model: "troupe/../etc" }, OpenAI.NotFoundError, /does not exist/],
      [{ messages: [] }, OpenAI.BadRequestError, /non-empty array/],
      [{ messages: [{ role: "assistant", content: "hi" }] }, OpenAI.BadRequestError, /last message must be the user's/],
      [
        { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://x/y.png" } }] }] },
        OpenAI.BadRequestError,
        /the image at http:\/\/x\/y\.png cannot be fetched: x does not resolve/,
      ],
      [
        {
          messages: [
            { role: "user", content: [{ type: "image_url", image_url: { url: "http://169.254.169.254/a.png" } }] },
          ],
        },
        OpenAI.BadRequestError,
        /cannot be fetched: .*not a public address/,
      ],
      [
        { messages: [{ role: "user", content: [{ type: "input_audio", input_audio: { data: "", format: "wav" } }] }] },
        OpenAI.BadRequestError,
        /content parts must be text or image_url/,
      ],
      [
        {
          messages: [
            { role: "user", content: [{ type: "image_url", image_url: { url: "data:image/png;base64,aGVsbG8=" } }] },
          ],
        },
        OpenAI.BadRequestError,
        /not a PNG, JPEG, GIF or WebP image/,
      ],
      [
        { tools: [{ type: "function", function: { name: "f", parameters: {} } }], tool_choice: "required" },
        OpenAI.BadRequestError,
        /tool_choice/,
      ],
      [
        { tools: [{ type: "function", function: { name: "no spaces", parameters: {} } }] },
        OpenAI.BadRequestError,
        /function.name/,
      ],
      [
        { messages: [{ role: "tool", tool_call_id: "call_made_up", content: "x" }] },
        OpenAI.BadRequestError,
        /not one this server gave out/,
      ],
    ];
    for (const [params, kind, message] of cases) {
      await assert.rejects(
        client.chat.completions.create({
          model: "troupe/main",
          messages: [{ role: "user", content: "hi" }],
          ...params,
        } as OpenAI.ChatCompletionCreateParamsNonStreaming),
        (e: unknown) => e instanceof kind && message.test((e as Error).message),
        JSON.stringify(params),
      );
    }
    const raw = await fetch(`http://${stack.addr.http}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
      body: "{nope",
    });
    assert.equal(raw.status, 400);
    assert.deepEqual(await raw.json(), {
      error: { message: "the request body is not JSON", type: "invalid_request_error", param: null, code: null },
    });
  });

  test("a client that goes away mid-stream stops the run", async () => {
    const { data: stream, response } = await client.chat.completions
      .create({ model: "troupe/main", messages: [{ role: "user", content: "!tokens 400 rate=40" }], stream: true })
      .withResponse();
    const sessionId = response.headers.get("x-troupe-session")!;
    let chunks = 0;
    for await (const _ of stream) if (++chunks === 5) break;
    // At 40 tokens a second the whole reply would take 10 s; it is cut within a few.
    await waitFor(
      "the run to end, cut short",
      async () => {
        const reply = (await stack.gateway.getHistory({ sessionId })).messages.at(-1);
        return reply?.role === Role.ASSISTANT && reply.text.split(" ").length < 200;
      },
      5000,
    );
    const sessions = await stack.gateway.listSessions({});
    assert.equal(sessions.sessions.find((s) => s.sessionId === sessionId)?.running, false);
  });

  test("a runner killed mid-run: the request still gets the whole reply, streamed or not", async () => {
    const words = (n: number) => Array.from({ length: n }, (_, i) => `t${i + 1}`).join(" ");
    // Streamed: what was sent before the kill cannot be taken back; the resumed reply follows it.
    const stream = await client.chat.completions.create({
      model: "troupe/main",
      messages: [{ role: "user", content: "!tokens 40 rate=20" }],
      stream: true,
    });
    let streamed = "";
    let finish: string | null = null;
    let killed: Promise<unknown> | undefined;
    for await (const chunk of stream) {
      streamed += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (!killed && streamed.includes("t5 "))
        killed = stack.kill("runner", "SIGKILL").then(() => stack.start("runner"));
    }
    await killed;
    assert.equal(finish, "stop");
    assert.ok(streamed.trimEnd().endsWith(words(40)), streamed);
    assert.ok(streamed.startsWith("t1 t2 t3 t4 t5 "), streamed);

    // Not streamed: only the reply the resumed run gave.
    const asked = ask("!tokens 40 rate=20");
    await new Promise((r) => setTimeout(r, 800));
    await stack.kill("runner", "SIGKILL");
    await stack.start("runner");
    const { choices } = await asked;
    assert.equal(choices[0].message.content?.trim(), words(40));
    assert.equal(choices[0].finish_reason, "stop");
  });
});

describe("function calling, as OpenAI's clients do it", () => {
  const weather: OpenAI.ChatCompletionTool = {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string" } },
        required: ["city"],
        additionalProperties: false,
      },
    },
  };
  const asking = '!call get_weather {"city": "Oslo"}';

  test("not streamed: tool_calls with finish_reason tool_calls, then the tool message resumes the run", async () => {
    const first = await client.chat.completions.create({
      model: "troupe/main",
      messages: [{ role: "user", content: asking }],
      tools: [weather],
    });
    const choice = first.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.content, null);
    const [call] = choice.message.tool_calls ?? [];
    assert.equal(call?.type, "function");
    assert.equal(call.type === "function" && call.function.name, "get_weather");
    assert.deepEqual(call.type === "function" && JSON.parse(call.function.arguments), { city: "Oslo" });
    const history: OpenAI.ChatCompletionMessageParam[] = [
      { role: "user", content: asking },
      choice.message,
      { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" },
    ];
    const second = await client.chat.completions.create({ model: "troupe/main", messages: history, tools: [weather] });
    assert.equal(second.choices[0].finish_reason, "stop");
    assert.match(second.choices[0].message.content ?? "", /Tool results: sunny, 21 C/);
    // The same request again (a client's retry) is answered the same, and the result is used once.
    const { data: again, response } = await client.chat.completions
      .create({ model: "troupe/main", messages: history, tools: [weather] })
      .withResponse();
    assert.equal(again.choices[0].message.content, second.choices[0].message.content);
    const session = response.headers.get("x-troupe-session") ?? "";
    const kept = (await stack.gateway.getHistory({ sessionId: session })).messages;
    assert.equal(kept.filter((m) => m.role === Role.TOOL).length, 1, "one result in the history");
    // Another answer to the same call is refused: it was answered.
    await assert.rejects(
      client.chat.completions.create({
        model: "troupe/main",
        tools: [weather],
        messages: [...history.slice(0, 2), { role: "tool", tool_call_id: call.id, content: "rain" }],
      }),
      (e: unknown) => e instanceof OpenAI.NotFoundError || e instanceof OpenAI.BadRequestError,
    );
  });

  test("streamed: the call's id and name, then its arguments as deltas; the answer streams after the tool message", async () => {
    const stream = await client.chat.completions.create({
      model: "troupe/main",
      messages: [{ role: "user", content: asking }],
      tools: [weather],
      stream: true,
    });
    const calls: { id: string; name: string; arguments: string }[] = [];
    let finish: string | null = null;
    let argumentDeltas = 0;
    for await (const chunk of stream) {
      for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
        calls[d.index] ??= { id: "", name: "", arguments: "" };
        if (d.id) calls[d.index].id = d.id;
        if (d.function?.name) calls[d.index].name = d.function.name;
        if (d.function?.arguments) {
          calls[d.index].arguments += d.function.arguments;
          argumentDeltas++;
        }
      }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, "tool_calls");
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, "get_weather");
    assert.ok(argumentDeltas >= 1);
    assert.deepEqual(JSON.parse(calls[0].arguments), { city: "Oslo" });
    const answer = await client.chat.completions.create({
      model: "troupe/main",
      stream: true,
      tools: [weather],
      messages: [
        { role: "user", content: asking },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: calls[0].id, type: "function", function: { name: calls[0].name, arguments: calls[0].arguments } },
          ],
        },
        { role: "tool", tool_call_id: calls[0].id, content: "cloudy" },
      ],
    });
    let text = "";
    for await (const chunk of answer) text += chunk.choices[0]?.delta.content ?? "";
    assert.match(text, /Tool results: cloudy/);
  });

  test("the OpenAI Agents SDK runs an agent on Troupe's /v1, its function tool running in this process", async () => {
    setTracingDisabled(true);
    const cities: string[] = [];
    const getWeather = weatherTool(cities);
    const agent = new Agent({
      name: "weather-asker",
      instructions: "Answer with the weather.",
      model: new OpenAIChatCompletionsModel(client as never, "troupe/main"),
      tools: [getWeather],
    });
    const result = await run(agent, asking);
    assert.deepEqual(cities, ["Oslo"], "the SDK ran the tool once, here");
    assert.match(String(result.finalOutput), /Tool results: foggy in Oslo/);
  });
});
