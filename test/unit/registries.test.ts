// Every extension point is a registry (docs/extending.md): what each holds, and that what it holds
// works as its contract says. A new tool, provider kind, store or channel adapter shows up here, so
// the list below changes with it, on purpose.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { CHANNEL_ADAPTERS } from "../../services/adapter/registry.js";
import { SERVICES } from "../../services/cli/service-starters.js";
import { MEMBERSHIPS, RunnerDirectory } from "../../services/router/membership.js";
import { PROVIDER_CLIENTS } from "../../services/runner/providers/provider-models.js";
import { RUNNER_STORES } from "../../services/runner/store/registry.js";
import { TOOLS, type ToolDeps, toolsFor } from "../../services/runner/tools/registry.js";
import { Secrets } from "../../services/runner/tools/web-tools.js";
import { BackgroundProcesses } from "../../services/runner/tools/background.js";
import type { Config } from "../../services/shared/config/config-types.js";
import { PROVIDER_KINDS } from "../../services/shared/models/provider-kinds.js";
import { storeKind } from "../../services/shared/store-kind.js";
import { DEFAULT_NET_POLICY } from "../../services/shared/net/net-guard.js";
import { DEFAULT_QUOTAS } from "../../services/shared/auth/quotas.js";
import { DEFAULT_AGENT } from "../../services/runner/agent-config.js";

describe("the registries", () => {
  test("tools: each factory makes the tools the agent may be offered, named once", () => {
    assert.deepEqual(Object.keys(TOOLS), [
      "exec",
      "files",
      "process",
      "memory",
      "web_fetch",
      "http_request",
      "schedule",
      "delegate",
    ]);
    // Making a run's tools calls no client: the clients here would throw if one were called.
    const never = new Proxy({}, { get: () => assert.fail("a client was called while the tools were made") });
    const deps: ToolDeps = {
      actor: { ref: { tenant: "t", principal: "p", sessionId: "s" } } as never,
      owner: { tenant: "t", principal: "p", role: "user" } as never,
      agentId: "main",
      agentConfig: async () => ({ ...DEFAULT_AGENT, name: "main" }),
      egress: async () => undefined,
      quotas: () => DEFAULT_QUOTAS,
      sandbox: never as never,
      memory: never as never,
      memoryScope: { tenant: "t", owner: "p" },
      memorySaved: () => undefined,
      execTimeoutMs: 1000,
      net: DEFAULT_NET_POLICY,
      secrets: new Secrets("/nonexistent/secrets.json"),
      background: new BackgroundProcesses(never as never),
      schedules: { book: never as never, changed: () => undefined },
      answering: async () => "",
      subagentsRunning: new Map(),
      createChild: () => assert.fail("no child is made while the tools are"),
    };
    const names = toolsFor(deps).map((t) => t.name);
    assert.deepEqual(names, [
      "exec",
      "read_file",
      "write_file",
      "list_files",
      "process",
      "memory_search",
      "memory_save",
      "memory_forget",
      "web_fetch",
      "http_request",
      "manage_schedule",
      "delegate_task",
    ]);
    assert.equal(new Set(names).size, names.length, "a tool name registered twice");
  });

  test("provider kinds: every kind has its protocol and the runner's streaming client", () => {
    const kinds = ["openai", "openai-responses", "openai-compatible", "anthropic"];
    assert.deepEqual(Object.keys(PROVIDER_KINDS), kinds);
    assert.deepEqual(Object.keys(PROVIDER_CLIENTS).sort(), [...kinds].sort());
    assert.deepEqual(
      kinds.filter((k) => PROVIDER_KINDS[k as keyof typeof PROVIDER_KINDS].embeddings),
      ["openai", "openai-responses", "openai-compatible"],
    );
    const q = PROVIDER_KINDS.anthropic.question;
    assert.equal(
      q.answer({ content: [{ type: "text", text: "a" }, { type: "tool_use" }, { type: "text", text: "b" }] }),
      "ab",
    );
    assert.equal(PROVIDER_KINDS.openai.question.answer({ choices: [{ message: { content: "x" } }] }), "x");
    assert.equal(PROVIDER_KINDS.openai.question.answer({ nothing: true }), "");
  });

  test("stores: the URL's scheme names one, in every service that keeps state", () => {
    assert.equal(storeKind(""), "file");
    assert.equal(storeKind("postgres://u@h/db"), "postgres");
    assert.equal(storeKind("PostgreSQL://u@h/db"), "postgres");
    assert.throws(
      () => storeKind("mysql://u@h/db"),
      /TROUPE_STORE_URL: no store takes this URL \(schemes: postgres, postgresql\)/,
    );
    assert.throws(() => storeKind("/var/lib/troupe"), /no store takes this URL/);
    assert.deepEqual(Object.keys(RUNNER_STORES), ["file", "postgres"]);
    assert.deepEqual(Object.keys(MEMBERSHIPS), ["file", "postgres"]);
    const directory = new RunnerDirectory();
    const files = MEMBERSHIPS.file("", 1000, directory);
    assert.equal(files.membership, directory, "on files, the router's own directory");
    assert.match(files.noneLive, /troupe runner/);
  });

  test("channel adapters: each loads, has a DM policy, and says what its settings lack", async () => {
    assert.deepEqual(Object.keys(CHANNEL_ADAPTERS), ["webhook", "telegram", "slack"]);
    const none = {
      webhookSecret: "",
      webhookReplyUrl: "",
      telegramBotToken: "",
      slackBotToken: "",
    } as Config["adapter"];
    const policies: Record<string, string> = {};
    for (const [kind, load] of Object.entries(CHANNEL_ADAPTERS)) {
      const adapter = await load();
      policies[kind] = adapter.defaultDmPolicy;
      assert.match(adapter.missing(none) ?? "", /^set [A-Z_]+/, kind);
    }
    assert.deepEqual(policies, { webhook: "open", telegram: "pairing", slack: "pairing" });
  });

  test("services: troupe serve starts each by name", () => {
    assert.deepEqual(Object.keys(SERVICES).sort(), ["gateway", "memory", "router", "runner", "sandbox"]);
  });
});
