// An agent's own files: agent.json's defaults and the error for each kind of mistake, and the
// example plugin (examples/hooks/guard.mjs) loaded and guarding as its README says.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import {
  AgentConfigError,
  AgentConfigs,
  DEFAULT_AGENT,
  parseAgentConfig,
  toolOffered,
} from "../../services/runner/agent-config.js";
import { Hooks } from "../../services/runner/loop/hooks.js";

describe("agent.json", () => {
  test("defaults, and a clear error for each kind of mistake", () => {
    assert.deepEqual(parseAgentConfig("a", {}), { name: "a", ...DEFAULT_AGENT });
    assert.deepEqual(parseAgentConfig("a", { http: { allowHosts: ["*.example.com"] } }).http, {
      allowHosts: ["*.example.com"],
      secrets: {},
    });
    assert.deepEqual(parseAgentConfig("a", { egress: { allowHosts: ["pypi.org"] } }).egress, {
      allowHosts: ["pypi.org"],
      budgetMb: 1024,
    });
    const bad: [unknown, RegExp][] = [
      [[], /must be a JSON object/],
      [{ contextWindow: 10 }, /contextWindow must be an integer from 512/],
      [{ fallbacks: "gpt" }, /fallbacks must be a list/],
      [{ retry: { maxRetries: 99 } }, /retry\.maxRetries must be an integer from 0 to 10/],
      [{ reserveTokens: 200_000 }, /reserveTokens \(200000\) must be below contextWindow/],
      [{ colour: "blue" }, /unknown field colour/],
      [{ http: { allowHosts: ["HTTP://api.example.com"] } }, /http\.allowHosts\[0\] must be a lower-case host name/],
      [{ http: { secrets: { token: ["a.example"] } } }, /http\.secrets has a name that is not allowed: "token"/],
      [{ http: { secrets: { TOKEN: "a.example" } } }, /http\.secrets\.TOKEN must be a list of at most 100 host names/],
      [{ webFetch: "yes" }, /webFetch must be true or false/],
      [{ egress: { allowHosts: ["http://pypi.org"] } }, /egress\.allowHosts\[0\] must be a lower-case host name/],
      [{ egress: { budgetMb: 0 } }, /egress\.budgetMb must be an integer from 1 to 65536/],
      [{ egress: { hosts: [] } }, /egress: unknown field hosts \(known: allowHosts, budgetMb\)/],
      [{ tools: ["exec", "shell"] }, /tools\[1\] must be a tool's name: exec, read_file/],
    ];
    for (const [doc, why] of bad)
      assert.throws(
        () => parseAgentConfig("a", doc),
        (e: Error) => e instanceof AgentConfigError && why.test(e.message),
        JSON.stringify(doc),
      );
  });
});

test("the agent.json cache keeps the agents used last, and a folder's config survives eviction", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-agents-"));
  try {
    await mkdir(path.join(dir, "writer"));
    await writeFile(path.join(dir, "writer", "agent.json"), JSON.stringify({ contextWindow: 64_000 }));
    const configs = new AgentConfigs(dir, 1000, 5);
    assert.equal((await configs.get("writer")).config.contextWindow, 64_000);
    // Any well-formed id names an agent with the defaults; clients choose them.
    for (let i = 0; i < 50; i++) assert.equal((await configs.get(`made-up-${i}`)).config.name, `made-up-${i}`);
    assert.equal(configs.size, 5);
    assert.equal((await configs.get("writer")).config.contextWindow, 64_000, "read again after eviction");
    // A hit moves an agent to the far side from eviction.
    for (let i = 0; i < 4; i++) await configs.get(`again-${i}`);
    await configs.get("writer");
    await configs.get("again-4");
    assert.equal(configs.size, 5);
    await rm(path.join(dir, "writer"), { recursive: true });
    assert.equal((await configs.get("writer")).config.contextWindow, 64_000, "still held: no read within recheckMs");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the tools a run offers follow agent.json", () => {
  const offered = (json: object) =>
    ["exec", "web_fetch", "http_request", "manage_schedule"].filter((n) => toolOffered(parseAgentConfig("a", json), n));
  assert.deepEqual(offered({}), ["exec", "web_fetch", "manage_schedule"]);
  assert.deepEqual(offered({ http: { allowHosts: ["api.example.com"] } }), [
    "exec",
    "web_fetch",
    "http_request",
    "manage_schedule",
  ]);
  assert.deepEqual(offered({ webFetch: false, tools: ["exec", "web_fetch"] }), ["exec"]);
});

describe("the example plugin", () => {
  test("examples/hooks/guard.mjs loads and guards", async () => {
    const { loadPlugins } = await import("../../services/runner/loop/hooks.js");
    const hooks = new Hooks();
    await loadPlugins(hooks, [path.resolve(import.meta.dirname, "../../../examples/hooks/guard.mjs")]);
    const info = { sessionId: "s", agentId: "a", sender: "u" };
    let reason = "";
    await hooks.modify(
      "before_tool_call",
      { ...info, toolCallId: "c", toolName: "exec", args: { command: "rm -rf /workspace" } },
      (p, r) => ((reason = r.reason ?? ""), { payload: p, stop: true }),
    );
    assert.match(reason, /recursive deletes are not allowed/);
    const out = await hooks.modify(
      "after_tool_call",
      {
        ...info,
        toolCallId: "c",
        toolName: "exec",
        args: {},
        result: { output: "token sk-abcdefghijklmnop", isError: false },
      },
      (p, r) => ({ payload: { ...p, result: { ...p.result, output: r.output ?? p.result.output } } }),
    );
    assert.equal(out.payload.result.output, "token [redacted]");
    const verdict = await hooks.threatChecks[0].check(
      "-----BEGIN PRIVATE KEY-----",
      { ...info, frameId: "f" },
      new AbortController().signal,
    );
    assert.equal(verdict.level, "high");
    await assert.rejects(
      loadPlugins(new Hooks(), ["/nonexistent/plugin.mjs"]),
      /plugin \/nonexistent\/plugin\.mjs could not be loaded/,
    );
  });
});
