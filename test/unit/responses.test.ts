// The Responses API's request and response folds (gateway/http/responses-input.ts and
// responses-output.ts), in process: ids that name exactly one run, input items as chat messages,
// parameters refused by name, and a run's events as the reference's stream events, across a
// runner's restart.
import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { AgentEventSchema, Role, StopReason } from "../../services/shared/gen/troupe/v1/session_pb.js";
import {
  messagesOf,
  responseIdOf,
  responseRefOf,
  responsesRequestOf,
} from "../../services/gateway/http/responses-input.js";
import { newResponse, ResponseFold } from "../../services/gateway/http/responses-output.js";
import { ApiError } from "../../services/gateway/http/openai-request.js";

test("a response id names one run of one session, and nothing else decodes", () => {
  for (const sessionId of ["a", "openai-response-1", "ü/../x y", "a.b.c"]) {
    const ref = { sessionId, afterSeq: 41n, kind: "p" as const, frameId: "f00d" };
    assert.deepEqual(responseRefOf(responseIdOf(ref)), ref);
  }
  const ids = new Set(
    ["a", "b"].flatMap((s) =>
      [1n, 2n].map((n) => responseIdOf({ sessionId: s, afterSeq: n, kind: "c", frameId: "x" })),
    ),
  );
  assert.equal(ids.size, 4);
  for (const bad of ["resp_nope", "resp_YQ.1", "resp_YQ.-1.pf", "resp_YQ.1.qf", "resp_YQ=.1.pf", "chatcmpl-1", ""])
    assert.equal(responseRefOf(bad), undefined, bad);
});

test("input items become chat messages: parts, calls of one turn together, outputs as tool messages", () => {
  assert.deepEqual(messagesOf("hi"), [{ role: "user", content: "hi" }]);
  const out = messagesOf([
    { role: "developer", content: "be brief" },
    {
      type: "message",
      role: "user",
      content: [
        { type: "input_text", text: "see" },
        { type: "input_image", image_url: "data:x" },
      ],
    },
    { type: "function_call", call_id: "c1", name: "f", arguments: "{}" },
    { type: "function_call", call_id: "c2", name: "g", arguments: "{}" },
    { type: "function_call_output", call_id: "c1", output: "one" },
    { type: "function_call_output", call_id: "c2", output: "two" },
  ]);
  assert.deepEqual(out, [
    { role: "developer", content: "be brief" },
    {
      role: "user",
      content: [
        { type: "text", text: "see" },
        { type: "image_url", image_url: { url: "data:x" } },
      ],
    },
    {
      role: "assistant",
      content: null,
      tool_calls: [
        { id: "c1", type: "function", function: { name: "f", arguments: "{}" } },
        { id: "c2", type: "function", function: { name: "g", arguments: "{}" } },
      ],
    },
    { role: "tool", tool_call_id: "c1", content: "one" },
    { role: "tool", tool_call_id: "c2", content: "two" },
  ]);
});

test("what a run cannot do is a 400 naming it; defaults a client library sends are taken", () => {
  const refused = (body: Record<string, unknown>, param: string) =>
    assert.throws(
      () => responsesRequestOf({ model: "troupe", input: "hi", ...body }),
      (e: unknown) => e instanceof ApiError && e.status === 400 && e.param === param,
      JSON.stringify(body),
    );
  refused({ top_logprobs: 2 }, "top_logprobs");
  refused({ max_tokens: 10 }, "max_tokens");
  refused({ text: { format: { type: "json_schema" } } }, "text");
  refused({ include: ["reasoning.encrypted_content"] }, "include");
  refused({ tools: [{ type: "file_search" }] }, "tools");
  refused({ tool_choice: "required", tools: [{ type: "function", name: "f" }] }, "tool_choice");
  refused({ background: true, store: false }, "store");
  refused({ input: [{ type: "item_reference", id: "x" }] }, "input");
  refused({ temperature: 3 }, "temperature");
  const ok = responsesRequestOf({
    model: "troupe",
    input: "hi",
    include: [],
    text: { format: { type: "text" } },
    truncation: "disabled",
    parallel_tool_calls: false,
    temperature: 0.5,
    max_output_tokens: 64,
    instructions: "be brief",
  });
  assert.deepEqual(ok.sampling, { temperature: 0.5, maxOutputTokens: 64 });
  assert.deepEqual(ok.messages[0], { role: "system", content: "be brief" });
  assert.throws(
    () => responsesRequestOf({ model: "troupe", input: "hi", previous_response_id: "resp_x" }),
    (e: unknown) => e instanceof ApiError && e.status === 404,
  );
});

const ev = (seq: number, payload: object) =>
  create(AgentEventSchema, { sessionId: "s", seq: BigInt(seq), turnId: "t", payload: payload as never });
const message = (id: string, text = "") => ({ id, role: Role.ASSISTANT, text });

test("a run folds into the reference's events; a restart leaves the cut message incomplete", () => {
  const fold = new ResponseFold(
    newResponse({ id: "resp_x", model: "troupe/main", background: false, store: true, previous_response_id: null }),
    "s",
  );
  const types = fold.opening().map((e) => e.type);
  const take = (seq: number, payload: object) => types.push(...fold.take(ev(seq, payload)).map((e) => e.type));
  take(1, { case: "agentStart", value: { frameId: "f" } });
  take(2, { case: "messageStart", value: { message: message("m1") } });
  take(3, { case: "messageUpdate", value: { messageId: "m1", delta: { case: "text", value: "cut " } } });
  take(4, { case: "runResumed", value: {} });
  take(5, { case: "messageStart", value: { message: message("m2") } });
  take(6, { case: "messageUpdate", value: { messageId: "m2", delta: { case: "text", value: "whole" } } });
  take(7, { case: "messageEnd", value: { message: message("m2", "whole answer") } });
  take(8, { case: "agentEnd", value: { stopReason: StopReason.LENGTH, usage: { inputTokens: 3, outputTokens: 4 } } });
  assert.deepEqual(types, [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.incomplete",
  ]);
  const r = fold.response;
  assert.equal(r.status, "incomplete");
  assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
  assert.deepEqual(
    r.output.map((i) => (i.type === "message" ? [i.status, i.content[0].text] : [])),
    [
      ["incomplete", "cut "],
      ["completed", "whole answer"],
    ],
  );
  assert.equal(r.usage?.total_tokens, 7);
  // Nothing after the end changes it.
  assert.deepEqual(fold.take(ev(9, { case: "agentStart", value: {} })), []);
});
