// The standard protocols on Troupe's edges, driven by clients nobody here wrote, against one stack:
// - the Responses API (openai-responses.ts) through the official `openai` SDK and the OpenAI
//   Agents SDK's default model: responses whole and streamed with the reference's events, GET
//   (and its replayed stream), previous_response_id, instructions, function tools as client
//   tools, background runs and their cancel, store: false, errors as the SDK's classes;
// - A2A (gateway/a2a/) through `@a2a-js/sdk`'s client, on both bindings: cards, send, stream,
//   get, cancel, resubscribe, contexts, idempotent sends, errors as its classes, strangers.
// Replies come from the scripted model (docs/scripted-model.md).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled } from "@openai/agents";
import { ASKING_WEATHER, WEATHER_PARAMETERS, weatherTool } from "./helpers/weather-tool.js";
import { randomUUID } from "node:crypto";
import { AgentCard, Role as A2aRole, TaskState, type Task, type StreamResponse } from "@a2a-js/sdk";
import {
  type Client as A2aClient,
  ClientFactory,
  ClientFactoryOptions,
  createAuthenticatingFetchWithRetry,
  JsonRpcTransportFactory,
} from "@a2a-js/sdk/client";
import { GrpcTransportFactory } from "@a2a-js/sdk/client/grpc";
import {
  TaskNotCancelableError,
  TaskNotFoundError,
  UnsupportedOperationError,
  ContentTypeNotSupportedError,
} from "@a2a-js/sdk/errors";
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

/** An A2A client of `key`, from the agent's card, on the binding asked for. */
async function a2aClient(key: string, binding: "JSONRPC" | "GRPC", agent = "main"): Promise<A2aClient> {
  const fetchImpl = createAuthenticatingFetchWithRetry(fetch, {
    headers: async () => ({ authorization: `Bearer ${key}` }),
    shouldRetryWithHeaders: async () => undefined,
  });
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl }), new GrpcTransportFactory()],
      preferredTransports: [binding],
    }),
  );
  return factory.createFromUrl(`http://${stack.addr.http}/a2a/${agent}/`);
}

/**
 * A client that speaks A2A 0.3 (the SDK's legacy JSON-RPC transport: message/send, tasks/get...),
 * as an agent built before 1.0 does, to the agent's JSON-RPC endpoint.
 */
/** Starts a 400-token task in the background, waits for its first tokens and cancels it: the canceled task. */
async function cancelWhileStreaming(
  client: A2aClient,
  auth: ReturnType<typeof keyed>,
  background: { returnImmediately: boolean; acceptedOutputModes: string[] },
) {
  const configuration = { ...background, historyLength: undefined, taskPushNotificationConfig: undefined };
  const slow = asTask(await client.sendMessage({ ...userMessage("!tokens 400 rate=40"), configuration }, auth));
  await waitFor(
    "tokens flowing",
    async () => replyOf(await client.getTask({ id: slow.id, tenant: "", historyLength: undefined }, auth)) !== "",
  );
  const canceled = await client.cancelTask({ id: slow.id, tenant: "", metadata: undefined }, auth);
  assert.equal(canceled.status?.state, TaskState.TASK_STATE_CANCELED);
  return canceled;
}

async function legacyClient(key: string): Promise<A2aClient> {
  const fetchImpl = createAuthenticatingFetchWithRetry(fetch, {
    headers: async () => ({ authorization: `Bearer ${key}` }),
    shouldRetryWithHeaders: async () => undefined,
  });
  const json = await (await fetch(`http://${stack.addr.http}/a2a/main/.well-known/agent-card.json`)).json();
  const card = AgentCard.fromJSON(json);
  card.supportedInterfaces = card.supportedInterfaces
    .filter((i) => i.protocolBinding === "JSONRPC")
    .map((i) => ({ ...i, protocolVersion: "0.3" }));
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl, legacyCompat: { enabled: true } })],
    }),
  );
  return factory.createFromAgentCard(card);
}

const keyed = (key: string) => ({ serviceParameters: { authorization: `Bearer ${key}` } });
const userMessage = (text: string, more: Record<string, unknown> = {}) => ({
  message: {
    messageId: randomUUID(),
    contextId: "",
    taskId: "",
    role: A2aRole.ROLE_USER,
    parts: [{ content: { $case: "text" as const, value: text }, metadata: undefined, filename: "", mediaType: "" }],
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
    ...more,
  },
  tenant: "",
  configuration: undefined,
  metadata: undefined,
});
const replyOf = (t: Task) =>
  t.artifacts
    .flatMap((a) => a.parts)
    .map((p) => (p.content?.$case === "text" ? p.content.value : ""))
    .join("");
const asTask = (r: unknown): Task => {
  assert.ok(r && typeof r === "object" && "status" in r, `a task: ${JSON.stringify(r)}`);
  return r as Task;
};
/** The reply a stream of updates builds, and the states it went through. */
function readUpdates(updates: StreamResponse[]) {
  let text = "";
  const states: TaskState[] = [];
  for (const u of updates) {
    const p = u.payload;
    if (p?.$case === "task") {
      states.push(p.value.status!.state);
      text += replyOf(p.value);
    } else if (p?.$case === "statusUpdate") states.push(p.value.status!.state);
    else if (p?.$case === "artifactUpdate")
      text += p.value.artifact!.parts.map((x) => (x.content?.$case === "text" ? x.content.value : "")).join("");
  }
  return { text, states };
}
async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe("A2A, through @a2a-js/sdk's client", () => {
  test("cards are public and name both bindings and the key scheme; calls need a key", async () => {
    const card = (await (await fetch(`http://${stack.addr.http}/.well-known/agent-card.json`)).json()) as {
      name: string;
      supportedInterfaces: { protocolBinding: string; url: string; tenant?: string }[];
      securitySchemes: { apiKey: { httpAuthSecurityScheme: { scheme: string } } };
    };
    assert.equal(card.name, "main");
    const bindings = Object.fromEntries(card.supportedInterfaces.map((i) => [i.protocolBinding, i]));
    assert.equal(bindings.JSONRPC.url, `http://${stack.addr.http}/a2a/main`);
    assert.equal(bindings.GRPC.url, `127.0.0.1:${stack.addr.gateway.split(":")[1]}`);
    assert.equal(bindings.GRPC.tenant, "main");
    assert.equal(card.securitySchemes.apiKey.httpAuthSecurityScheme.scheme, "Bearer");
    assert.equal((await fetch(`http://${stack.addr.http}/a2a/nobody/.well-known/agent-card.json`)).status, 404);
    const bare = await fetch(`http://${stack.addr.http}/a2a/main`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "GetTask", params: { id: "x" } }),
    });
    assert.equal(bare.status, 401);
    const later = await fetch(`http://${stack.addr.http}/a2a/main`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${stack.apiKey}`, "a2a-version": "2.0" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "GetTask", params: { id: "x" } }),
    });
    assert.equal(((await later.json()) as { error: { code: number } }).error.code, -32009, "VersionNotSupported");
  });

  for (const binding of ["JSONRPC", "GRPC"] as const)
    test(`${binding}: send, continue the context, send again idempotently, stream, get`, async () => {
      const client = await a2aClient(stack.apiKey, binding);
      const auth = keyed(stack.apiKey);
      const first = asTask(await client.sendMessage(userMessage("My name is Ada."), auth));
      assert.equal(first.status?.state, TaskState.TASK_STATE_COMPLETED);
      assert.match(first.contextId, /^a2a-/);
      const sent = userMessage("!first", { contextId: first.contextId });
      const second = asTask(await client.sendMessage(sent, auth));
      assert.equal(second.contextId, first.contextId);
      assert.equal(replyOf(second).trim(), "My name is Ada.", "the context held the conversation");
      assert.deepEqual(
        second.history.map((m) => m.role),
        [A2aRole.ROLE_USER, A2aRole.ROLE_AGENT],
      );
      // The same message again (a client's retry): the same task, not a second run.
      const again = asTask(await client.sendMessage(sent, auth));
      assert.equal(again.id, second.id);
      const held = await stack.gateway.getHistory({ sessionId: first.contextId });
      assert.equal(held.messages.filter((m) => m.text === "!first").length, 1);

      const updates = await collect(client.sendMessageStream(userMessage("!tokens 5 rate=50"), auth));
      const { text, states } = readUpdates(updates);
      assert.equal(text.trim(), "t1 t2 t3 t4 t5");
      assert.equal(states[0], TaskState.TASK_STATE_SUBMITTED);
      assert.ok(states.includes(TaskState.TASK_STATE_WORKING));
      assert.equal(states.at(-1), TaskState.TASK_STATE_COMPLETED);
      const taskId = updates[0].payload?.$case === "task" ? updates[0].payload.value.id : "";
      const got = await client.getTask({ id: taskId, tenant: "", historyLength: 1 }, auth);
      assert.equal(got.status?.state, TaskState.TASK_STATE_COMPLETED);
      assert.equal(replyOf(got).trim(), "t1 t2 t3 t4 t5");
      assert.equal(got.history.length, 1, "history_length");
    });

  for (const binding of ["JSONRPC", "GRPC"] as const)
    test(`${binding}: a task in the background is resubscribed to, and canceled`, async () => {
      const client = await a2aClient(stack.apiKey, binding);
      const auth = keyed(stack.apiKey);
      const background = {
        returnImmediately: true,
        acceptedOutputModes: ["text/plain"],
        historyLength: undefined,
        taskPushNotificationConfig: undefined,
      };
      const quick = asTask(
        await client.sendMessage({ ...userMessage("!tokens 20 rate=20"), configuration: background }, auth),
      );
      assert.ok(!replyOf(quick).includes("t20"));
      const { text, states } = readUpdates(await collect(client.resubscribeTask({ id: quick.id, tenant: "" }, auth)));
      assert.equal(
        text.trim(),
        Array.from({ length: 20 }, (_, i) => `t${i + 1}`).join(" "),
        "nothing lost, nothing twice",
      );
      assert.equal(states.at(-1), TaskState.TASK_STATE_COMPLETED);

      const canceled = await cancelWhileStreaming(client, auth, background);
      assert.ok(replyOf(canceled).split(" ").length < 400);
      await assert.rejects(
        client.cancelTask({ id: canceled.id, tenant: "", metadata: undefined }, auth),
        TaskNotCancelableError,
      );
    });

  test("0.3's methods on the same endpoint: message/send, message/stream, tasks/get, tasks/cancel", async () => {
    const client = await legacyClient(stack.apiKey);
    const auth = keyed(stack.apiKey);
    const first = asTask(await client.sendMessage(userMessage("My name is Grace."), auth));
    assert.equal(first.status?.state, TaskState.TASK_STATE_COMPLETED);
    const second = asTask(await client.sendMessage(userMessage("!first", { contextId: first.contextId }), auth));
    assert.equal(replyOf(second).trim(), "My name is Grace.");
    const { text, states } = readUpdates(
      await collect(client.sendMessageStream(userMessage("!tokens 4 rate=40"), auth)),
    );
    assert.equal(text.trim(), "t1 t2 t3 t4");
    assert.equal(states.at(-1), TaskState.TASK_STATE_COMPLETED);
    const got = await client.getTask({ id: second.id, tenant: "", historyLength: undefined }, auth);
    assert.equal(replyOf(got).trim(), "My name is Grace.");
    const background = {
      returnImmediately: true,
      acceptedOutputModes: [],
      historyLength: undefined,
      taskPushNotificationConfig: undefined,
    };
    await cancelWhileStreaming(client, auth, background);
    await assert.rejects(
      client.getTask({ id: "task-nope", tenant: "", historyLength: undefined }, auth),
      TaskNotFoundError,
    );
    // The wire carried 0.3's method names (what a 0.3 agent sends), not 1.0's.
    const raw = await fetch(`http://${stack.addr.http}/a2a/main`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${stack.apiKey}` },
      body: JSON.stringify({ jsonrpc: "2.0", id: 7, method: "tasks/get", params: { id: second.id } }),
    });
    const body = (await raw.json()) as { result: { kind: string; status: { state: string } } };
    assert.deepEqual([body.result.kind, body.result.status.state], ["task", "completed"]);
  });

  for (const binding of ["JSONRPC", "GRPC"] as const)
    test(`${binding}: bad requests get A2A's errors; another tenant's task is not found`, async () => {
      const client = await a2aClient(stack.apiKey, binding);
      const auth = keyed(stack.apiKey);
      await assert.rejects(
        client.getTask({ id: "task-nope", tenant: "", historyLength: undefined }, auth),
        TaskNotFoundError,
      );
      await assert.rejects(
        client.sendMessage(userMessage("hi", { taskId: "task-x" }), auth),
        UnsupportedOperationError,
      );
      const pdf = userMessage("read this");
      pdf.message.parts = [
        {
          content: { $case: "url", value: "https://example.com/a.pdf" } as never,
          metadata: undefined,
          filename: "a.pdf",
          mediaType: "application/pdf",
        },
      ];
      await assert.rejects(client.sendMessage(pdf, auth), ContentTypeNotSupportedError);
      const mine = asTask(await client.sendMessage(userMessage("!tokens 1"), auth));
      const eve = await stack.keyFor("acme", "eve");
      const stranger = await a2aClient(eve, binding);
      await assert.rejects(
        stranger.getTask({ id: mine.id, tenant: "", historyLength: undefined }, keyed(eve)),
        TaskNotFoundError,
      );
      await assert.rejects(
        stranger.cancelTask({ id: mine.id, tenant: "", metadata: undefined }, keyed(eve)),
        TaskNotFoundError,
      );
      // The stranger's message in the owner's context id is in a context of the stranger's own.
      const theirs = asTask(
        await stranger.sendMessage(userMessage("!first", { contextId: mine.contextId }), keyed(eve)),
      );
      assert.equal(replyOf(theirs).trim(), "!first");
      // Without a key, nothing is served (JSON-RPC's 401 is in the cards' test; this client's
      // fetch adds the key to every request).
      if (binding === "GRPC")
        await assert.rejects(
          client.getTask({ id: mine.id, tenant: "", historyLength: undefined }, { serviceParameters: {} }),
          /UNAUTHENTICATED|16/,
        );
      assert.equal(
        asTask(await client.sendMessage(userMessage("!tokens 1"), auth)).status?.state,
        TaskState.TASK_STATE_COMPLETED,
      );
    });
});
