// The MCP pieces that need no server: which servers a tenant's session uses, what agent.json may
// say of them, how a call of theirs meets the approval policy, how a command line is quoted for
// the sandbox, and how a result's content reads to the model.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { AgentConfigError, parseAgentConfig } from "../../services/runner/agent-config.js";
import { approvalOf } from "../../services/runner/tools/approvals.js";
import { fillSecrets, serversFor } from "../../services/runner/tools/mcp/mcp-config.js";
import { resultImages, resultText } from "../../services/runner/tools/mcp/mcp-connection.js";
import { toModelMessages } from "../../services/runner/session/transcript.js";
import { create } from "@bufbuild/protobuf";
import { ChatMessageSchema, Role } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { shellLine } from "../../services/runner/tools/mcp/sandbox-stdio.js";

describe("MCP configuration", () => {
  test("a tenant's servers replace the agent's by name, and null removes one", () => {
    const agent = {
      mcpServers: { docs: { url: "https://docs.example/mcp" }, files: { command: "mcp-files" } },
      mcpTenants: { acme: { docs: { url: "https://acme.example/mcp" }, files: null } },
    };
    assert.deepEqual(serversFor(agent, "acme"), { docs: { url: "https://acme.example/mcp" } });
    assert.deepEqual(serversFor(agent, "other"), agent.mcpServers);
    assert.deepEqual(serversFor({}, "acme"), {});
  });

  test("agent.json: a server is a url or a command, named so its tools can carry the name", () => {
    const bad = (mcpServers: object, why: RegExp) =>
      assert.throws(
        () => parseAgentConfig("a", { mcpServers }),
        (e: Error) => e instanceof AgentConfigError && why.test(e.message),
      );
    bad({ x: { url: "https://a.example/mcp", command: "y" } }, /give either "url".*or "command"/);
    bad({ x: {} }, /give either "url"/);
    bad({ a__b: { url: "https://a.example/mcp" } }, /name that is not allowed: "a__b"/);
    bad({ x: { url: "ftp://a.example" } }, /url/);
    bad({ x: { command: "c", headers: { a: "b" } } }, /"headers" are for a url/);
    const ok = parseAgentConfig("a", {
      mcpServers: { x: { url: "https://a.example/mcp", headers: { authorization: "Bearer {{secret:TOKEN}}" } } },
      approvals: { tools: { "x__*": "allow" } },
    });
    assert.equal(ok.mcpServers?.x.url, "https://a.example/mcp");
  });

  test("secrets are filled from the runner's file, and a missing one is named", () => {
    assert.equal(fillSecrets("Bearer {{secret:TOKEN}}", { TOKEN: "s3cret" }, "x"), "Bearer s3cret");
    assert.throws(() => fillSecrets("{{secret:NOPE}}", {}, "x"), /MCP server x: secret NOPE is not configured/);
  });
});

describe("MCP calls and the approval policy", () => {
  const args = {};
  test("with no rule naming it, an MCP tool asks; a built-in one runs", () => {
    assert.equal(approvalOf(undefined, "t", "docs__search", args, "docs").mode, "ask");
    assert.equal(approvalOf(undefined, "t", "read_file", args).mode, "allow");
  });
  test("the tool's own rule, then its server's, then *", () => {
    const policy = { tools: { docs__search: "allow" as const, "docs__*": "deny" as const, "*": "ask" as const } };
    assert.equal(approvalOf(policy, "t", "docs__search", args, "docs").mode, "allow");
    assert.equal(approvalOf(policy, "t", "docs__delete", args, "docs").mode, "deny");
    assert.equal(approvalOf(policy, "t", "other__x", args, "other").mode, "ask");
    assert.equal(approvalOf({ tools: { "*": "allow" } }, "t", "other__x", args, "other").mode, "allow");
    // A tenant's rule for the server wins over the agent's.
    const tenants = { ...policy, tenants: { acme: { tools: { "docs__*": "allow" as const } } } };
    assert.equal(approvalOf(tenants, "acme", "docs__delete", args, "docs").mode, "allow");
  });
});

describe("MCP plumbing", () => {
  test("a stdio server's command line quotes every word for /bin/sh", () => {
    assert.equal(shellLine("node", ["/opt/a b.js", "it's"], {}), `exec 'node' '/opt/a b.js' 'it'\\''s'`);
    assert.equal(shellLine("srv", [], { TOKEN: "a$b" }), `exec env TOKEN='a$b' 'srv'`);
  });

  test("a result reads as text: images said, structured content kept, errors kept", () => {
    assert.equal(
      resultText({
        content: [
          { type: "text", text: "here" },
          { type: "image", data: "AAAA", mimeType: "image/png" },
          { type: "resource_link", uri: "file:///a", name: "a" },
          { type: "resource", resource: { uri: "file:///b", text: "B" } },
        ],
      }),
      "here\n[image image/png, 3 bytes]\n[resource file:///a (a)]\n[resource file:///b]\nB",
    );
    assert.equal(resultText({ content: [], structuredContent: { n: 1 } }), '{"n":1}');
    assert.equal(resultText({ content: [{ type: "text", text: '{"n":1}' }], structuredContent: { n: 1 } }), '{"n":1}');
    assert.equal(resultText({ content: [], isError: true }), "(the tool failed and said nothing)");
  });
});

describe("images a tool returned", () => {
  const png = Buffer.from(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=",
    "base64",
  );
  test("a result's images are kept by their bytes' type; what is not an image is left out", () => {
    const images = resultImages({
      content: [
        { type: "image", data: png.toString("base64"), mimeType: "image/jpeg" },
        { type: "image", data: Buffer.from("not an image").toString("base64"), mimeType: "image/png" },
      ],
    });
    assert.deepEqual(
      images.map((i) => i.mimeType),
      ["image/png"],
    );
  });

  test("they reach the model after their batch's last result, as a user message naming the tools", () => {
    const call = create(ChatMessageSchema, {
      role: Role.ASSISTANT,
      toolCalls: [
        { id: "a", name: "srv__shot" },
        { id: "b", name: "srv__text" },
      ],
    });
    const shot = create(ChatMessageSchema, {
      role: Role.TOOL,
      toolCallId: "a",
      toolName: "srv__shot",
      text: "[image image/png, 70 bytes]",
      images: [{ mimeType: "image/png", data: png }],
    });
    const text = create(ChatMessageSchema, { role: Role.TOOL, toolCallId: "b", toolName: "srv__text", text: "t" });
    const out = toModelMessages("sys", undefined, [call, shot, text]);
    assert.deepEqual(
      out.map((m) => m.role),
      ["system", "assistant", "tool", "tool", "user"],
    );
    const last = out[4] as { content: string; images?: { mimeType: string }[] };
    assert.match(last.content, /The images srv__shot returned/);
    assert.equal(last.images?.[0]?.mimeType, "image/png");
  });
});
