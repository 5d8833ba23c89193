// A Chat Completions request's messages as a session's history (openai-history.ts), the check of
// a request's earlier messages against a session's, and the API's check of OpenSession.history.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { ChatMessageSchema, Role } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { conversationOf, sameConversation } from "../../services/gateway/http/openai-history.js";
import { validateHistory } from "../../services/shared/frames.js";

describe("a request's messages as a conversation", () => {
  test("system messages become the instruction; the rest keep their order, tool calls included", () => {
    const c = conversationOf([
      { role: "system", content: "Be brief." },
      { role: "user", content: "weather?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }],
      },
      { role: "tool", tool_call_id: "c1", content: "sunny" },
      { role: "assistant", content: "Sunny." },
      { role: "developer", content: [{ type: "text", text: "Use metric." }] },
      { role: "user", content: [{ type: "text", text: "and tomorrow?" }] },
    ]);
    assert.equal(c.instruction, "Be brief.\n\nUse metric.");
    assert.deepEqual(c.last, { text: "and tomorrow?", urls: [] });
    assert.deepEqual(
      c.earlier.map((m) => [m.role, m.text ?? "", m.toolCallId ?? "", (m.toolCalls ?? []).map((t) => t.name)]),
      [
        [Role.USER, "weather?", "", []],
        [Role.ASSISTANT, "", "", ["get_weather"]],
        [Role.TOOL, "sunny", "c1", []],
        [Role.ASSISTANT, "Sunny.", "", []],
      ],
    );
  });

  test("what cannot be a conversation is a 400 naming the message", () => {
    const refused = (messages: unknown, why: RegExp) =>
      assert.throws(
        () => conversationOf(messages),
        (e: Error & { status?: number }) => e.status === 400 && why.test(e.message),
      );
    refused(
      [
        { role: "user", content: "a" },
        { role: "assistant", content: "b" },
      ],
      /last message must be the user's/,
    );
    refused(
      [
        { role: "robot", content: "a" },
        { role: "user", content: "b" },
      ],
      /messages\[0\]: role must be/,
    );
    refused(
      [
        { role: "tool", content: "x" },
        { role: "user", content: "b" },
      ],
      /messages\[0\]: a tool message needs its tool_call_id/,
    );
    refused(
      [
        { role: "assistant", tool_calls: [{ id: "c1" }] },
        { role: "user", content: "b" },
      ],
      /messages\[0\]\.tool_calls\[0\]: needs an id and a function name/,
    );
    refused([{ role: "user", content: "   " }], /no text/);
  });

  test("earlier messages must be the session's latest, in order; fewer is fine", () => {
    const held = [
      create(ChatMessageSchema, { role: Role.USER, text: "one" }),
      create(ChatMessageSchema, { role: Role.ASSISTANT, text: "", toolCalls: [{ id: "c", name: "exec" }] }),
      create(ChatMessageSchema, { role: Role.TOOL, text: "out", toolCallId: "c" }),
      create(ChatMessageSchema, { role: Role.ASSISTANT, text: "said one" }),
      create(ChatMessageSchema, { role: Role.USER, text: "two" }),
      create(ChatMessageSchema, { role: Role.ASSISTANT, text: "said two" }),
    ];
    const said = (pairs: [Role, string][]) => pairs.map(([role, text]) => ({ role, text }));
    assert.equal(sameConversation([], held), undefined);
    assert.equal(
      sameConversation(
        said([
          [Role.USER, "two"],
          [Role.ASSISTANT, "said two"],
        ]),
        held,
      ),
      undefined,
    );
    assert.equal(
      sameConversation(
        said([
          [Role.USER, "one"],
          [Role.ASSISTANT, "said one"],
          [Role.USER, "two"],
          [Role.ASSISTANT, "said two"],
        ]),
        held,
      ),
      undefined,
    );
    assert.match(
      sameConversation(
        said([
          [Role.USER, "two"],
          [Role.ASSISTANT, "other"],
        ]),
        held,
      ) ?? "",
      /earlier message 2/,
    );
    assert.match(sameConversation(said(Array(5).fill([Role.USER, "x"])), held) ?? "", /carries 5 .* holds 4/);
  });
});

describe("OpenSession.history", () => {
  test("user, assistant and tool messages, each with what it needs; at most 500", () => {
    validateHistory("f", [
      create(ChatMessageSchema, { role: Role.USER, text: "hi" }),
      create(ChatMessageSchema, { role: Role.ASSISTANT, toolCalls: [{ id: "c1", name: "f", argumentsJson: "{}" }] }),
      create(ChatMessageSchema, { role: Role.TOOL, toolCallId: "c1", text: "" }),
    ]);
    const refused = (m: object, why: RegExp) =>
      assert.throws(() => validateHistory("f", [create(ChatMessageSchema, m)]), why);
    refused({ role: Role.USER, text: " " }, /history\[0\]: a user message needs text or images/);
    refused({ role: Role.ASSISTANT }, /needs text or tool calls/);
    refused({ role: Role.ASSISTANT, toolCalls: [{ id: "c", name: "bad name" }] }, /a tool call needs an id/);
    refused({ role: Role.TOOL }, /names the call it answers/);
    refused({ role: Role.SYSTEM, text: "x" }, /role must be user, assistant or tool/);
    assert.throws(
      () => validateHistory("f", Array(501).fill(create(ChatMessageSchema, { role: Role.USER, text: "x" }))),
      /at most 500 messages/,
    );
  });
});
