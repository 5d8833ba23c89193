// The troupe command as a new user meets it: a typo is an error with a suggestion and never a
// server (`troupe memory lsit` used to start the memory service and create ./data/memory), every
// command answers --help, and --version says the version.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { AnthropicApiServer } from "./helpers/anthropic-api.js";
import { ChatApiServer } from "./helpers/openai-api.js";
import { MAIN } from "./helpers/stack.js";

function troupe(args: string[], cwd: string) {
  const r = spawnSync(process.execPath, [MAIN, ...args], { cwd, encoding: "utf8", timeout: 10_000 });
  return { code: r.status, out: r.stdout, err: r.stderr, signal: r.signal };
}

test("typos are errors with a suggestion; nothing starts and nothing is written", async (t) => {
  const cwd = await mkdtemp(path.join(os.tmpdir(), "troupe-cli-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const cases: [string[], RegExp][] = [
    [["memory", "lsit"], /unknown memory subcommand "lsit"; one of: add, search, forget, stats, reembed/],
    [["memroy"], /unknown command "memroy"; did you mean "memory"\?/],
    [["serve", "runnr"], /unknown service "runnr"; did you mean "runner"\?/],
    [["keys", "lss"], /unknown keys subcommand "lss"; did you mean "ls"\?/],
    [["store", "migrat"], /unknown store subcommand "migrat"; did you mean "migrate"\?/],
    [["gateway", "start"], /the gateway service takes flags only, not "start"/],
  ];
  for (const [args, message] of cases) {
    const r = troupe(args, cwd);
    assert.equal(r.signal, null, `${args.join(" ")} exited by itself (it did not start a server)`);
    assert.equal(r.code, 2, args.join(" "));
    assert.match(r.err, message);
  }
  assert.equal(existsSync(path.join(cwd, "data")), false, "no data directory was made");
});

test("the scripted model server refuses half a certificate and a file it cannot read", async (t) => {
  const cwd = await mkdtemp(path.join(os.tmpdir(), "troupe-cli-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const at = ["model-server", "--model-server", "127.0.0.1:0"];
  const half = troupe([...at, "--https-cert", "cert.pem"], cwd);
  assert.deepEqual([half.signal, half.code], [null, 1]);
  assert.match(half.err, /--https-cert and --https-key go together/);
  const missing = troupe([...at, "--https-cert", "cert.pem", "--https-key", "key.pem"], cwd);
  assert.deepEqual([missing.signal, missing.code], [null, 1]);
  assert.match(missing.err, /--https-cert: cannot read cert\.pem \(ENOENT/);
});

test("the package's bin runs as a program, as `npx troupe` runs it (make build sets its mode)", () => {
  // npx execs package.json's bin directly; without the executable bit, sh says "Permission denied".
  const r = spawnSync(MAIN, ["--version"], { encoding: "utf8" });
  assert.equal(r.error, undefined, String(r.error));
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^troupe \d+\.\d+\.\d+/);
});

test("--version and per-command --help answer and exit 0", async (t) => {
  const cwd = await mkdtemp(path.join(os.tmpdir(), "troupe-cli-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string };
  const v = troupe(["--version"], cwd);
  assert.equal(v.code, 0);
  assert.equal(v.out.trim(), `troupe ${pkg.version}`);
  for (const [args, shows] of [
    [
      ["chat", "--help"],
      /chat \[--session ID \| -c\] \[--agent A\] \[--model P\/M\] \[--json\] \[--instruction TEXT\][\s\S]*\[MESSAGE\]/,
    ],
    [["doctor", "--help"], /doctor +the same, with what to do about each problem/],
    [["logs", "--help"], /logs \[-f\] \[--service S\] \[-n N\]/],
    [["up", "--help"], /--runners N/],
    [["serve", "runner", "--help"], /serve gateway\|router\|runner\|memory\|sandbox/],
    [["memory", "--help"], /memory add\|search\|forget\|stats\|reembed/],
  ] as const) {
    const r = troupe([...args], cwd);
    assert.equal(r.code, 0, `${args.join(" ")}: ${r.err}`);
    assert.match(r.out, shows);
    assert.match(r.out, /--data-dir DIR/, "the shared flags too");
  }
  assert.equal(existsSync(path.join(cwd, "data")), false);
});

test("doctor names each configured model a provider retires or does not serve, and where it is configured", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-cli-"));
  const key = "sk-doctor";
  const openai = await new ChatApiServer({ flavour: "openai", apiKey: key }).start();
  const claude = await new AnthropicApiServer({ apiKey: key }).start();
  t.after(async () => {
    await Promise.all([openai.close(), claude.close()]);
    await rm(dir, { recursive: true, force: true });
  });
  const write = async (file: string, body: object) => {
    await mkdir(path.dirname(path.join(dir, file)), { recursive: true });
    await writeFile(path.join(dir, file), JSON.stringify(body));
  };
  const apiKey = { env: "TROUPE_TEST_DOCTOR_KEY" };
  await write("providers.json", {
    providers: {
      claude: { kind: "anthropic", baseUrl: claude.baseUrl, apiKey },
      openai: { kind: "openai", baseUrl: openai.baseUrl, apiKey },
      local: { kind: "openai-compatible", baseUrl: "http://127.0.0.1:9/v1" },
    },
  });
  await write("agents/support/agent.json", {
    model: "claude/claude-opus-4-7",
    fallbacks: ["claude/claude-sonnet-4-5"],
  });
  await write("agents/coder/agent.json", { model: "openai/gpt-5-mini", fallbacks: ["openai/gpt-5-mni"] });
  await write("agents/notes/agent.json", { model: "local/claude-sonnet-4-5" });
  /** `troupe <command>` against the files above, with TROUPE_MODEL set to `model`; its stdout lines. */
  const run = async (command: string, model: string) => {
    // Not spawnSync: the providers' servers answer from this process.
    const child = spawn(process.execPath, [MAIN, command, "--data-dir", dir], {
      env: {
        ...process.env,
        TROUPE_LEARNING_MODEL: "",
        TROUPE_PROVIDERS_FILE: path.join(dir, "providers.json"),
        TROUPE_TEST_DOCTOR_KEY: key,
        TROUPE_MODEL: model,
      },
    });
    let out = "";
    child.stdout.on("data", (c: Buffer) => {
      out += c.toString("utf8");
    });
    const timer = setTimeout(() => child.kill(), 20_000);
    await once(child, "close");
    clearTimeout(timer);
    return out.split("\n");
  };
  const lines = await run("doctor", "claude/claude-opus-4-5");
  const models = lines.find((l) => /^\S+\s+models /.test(l));
  // OpenAI's day is its Model object's shutdown_date; Anthropic's from its table. The same name on
  // a compatible server is that server's to retire, and is not asked about.
  assert.equal(
    models,
    "warn  models   end of life announced for claude/claude-opus-4-5 on 2027-01-22 (TROUPE_MODEL); " +
      "openai/gpt-5-mini on 2026-12-11 (agent coder); claude/claude-sonnet-4-5 on 2026-11-30 (agent support); " +
      "and not served by their provider (HTTP 404): openai/gpt-5-mni (agent coder)",
  );
  assert.match(lines[lines.indexOf(models!) + 1], /fix: move them to a later model, or correct the name/);
  await write("agents/support/agent.json", { model: "claude/claude-opus-4-7" });
  await write("agents/coder/agent.json", { model: "openai/gpt-4.1-mini" });
  const after = (await run("status", "claude/claude-opus-4-7")).join("\n");
  assert.match(after, /^ok {4}models {3}\d+ configured, none with an announced end of life$/m);
});
