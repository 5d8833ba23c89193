// The operator's JSON files against their published schemas (services/shared/schemas): each is
// refused with every problem and its place, unknown fields included (a typo is not ignored), the
// parsers keep the checks a schema cannot state, and `troupe config validate` reports as the
// services do, with its exit code.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { writeFile, mkdir } from "node:fs/promises";
import path from "node:path";
import { parseRouting } from "../../services/router/bindings.js";
import { parseAgentConfig } from "../../services/runner/agent-config.js";
import { NAME, parseKeys } from "../../services/shared/auth/api-keys.js";
import { CHANNEL_NAME, isAgentId } from "../../services/shared/ids.js";
import { SCHEMAS, type SchemaName, schemaProblems, validatorFile } from "../../services/shared/json-schema.js";
import { validatorSource } from "../../services/shared/schemas/compile.js";
import { parseProviders } from "../../services/shared/models/providers.js";
import { parseQuotas } from "../../services/shared/auth/quotas.js";
import { configCommand, kindOf } from "../../services/cli/config.js";
import { tempDir } from "../helpers/tempdir.js";

const HASH = "a".repeat(64);
const keysFile = (keys: unknown[]) => JSON.stringify({ keys });

describe("the schemas", () => {
  test("each is a JSON Schema (2020-12) with a title and a description; an empty file means the defaults", () => {
    // The keys file must list keys and the providers file providers; every other may be empty.
    const required: Record<string, string[]> = {
      "api-keys": ["keys is required"],
      providers: ["providers is required"],
      "webhook-message": ["id is required", "chat is required", "sender is required"],
    };
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      assert.equal(schema.$schema, "https://json-schema.org/draft/2020-12/schema", name);
      assert.ok(schema.title && schema.description, name);
      const problems = schemaProblems(name as keyof typeof SCHEMAS, {});
      assert.deepEqual(problems, required[name] ?? [], name);
    }
  });

  test("each compiled validator is the one its schema compiles to now (make build writes them)", () => {
    for (const name of Object.keys(SCHEMAS) as SchemaName[]) {
      const built = readFileSync(
        new URL(validatorFile(name), new URL("../../services/shared/", import.meta.url)),
        "utf8",
      );
      assert.equal(built, validatorSource(name), `${name}: rebuild with make build`);
    }
  });

  test("checking a file loads its validator, not ajv's compiler", () => {
    // A module loaded counts: the gateway checks its keys file at every start (bench/footprint).
    const script = `
      import { registerHooks } from "node:module";
      const seen = [];
      registerHooks({ resolve(spec, ctx, next) { const r = next(spec, ctx); seen.push(r.url); return r; } });
      const { parseKeys } = await import(${JSON.stringify(new URL("../../services/shared/auth/api-keys.js", import.meta.url).href)});
      parseKeys(${JSON.stringify(keysFile([{ tenant: "t", principal: "p", sha256: HASH }]))}, "keys.json");
      console.log(JSON.stringify(seen));
    `;
    const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
    const loaded = (JSON.parse(out.trim().split("\n").at(-1)!) as string[])
      .filter((u) => u.includes("/ajv/") || u.endsWith(".validate.cjs"))
      .map((u) => u.slice(u.lastIndexOf(u.includes("/node_modules/") ? "/node_modules/" : "/services/") + 1));
    assert.ok(loaded.includes("services/shared/schemas/api-keys.validate.cjs"), loaded.join(", "));
    assert.deepEqual(
      loaded.filter((u) => u.startsWith("node_modules/ajv/") && !u.startsWith("node_modules/ajv/dist/runtime/")),
      [],
      "only ajv's runtime helpers",
    );
  });

  test("their name patterns are the ones the code checks ids with", () => {
    const agentId = SCHEMAS.routing.$defs.agentId.pattern;
    const channel = SCHEMAS.routing.$defs.channel.pattern;
    const tenant = SCHEMAS["api-keys"].properties.keys.items.properties.tenant.pattern;
    assert.equal(tenant, NAME.source);
    assert.equal(channel, CHANNEL_NAME.source);
    for (const id of ["main", "a", "x-1_b", "Main", "-a", "", "a".repeat(65), "a b"])
      assert.equal(new RegExp(agentId).test(id), isAgentId(id), id);
  });
});

describe("every file refuses unknown fields, naming them", () => {
  const cases: [string, () => unknown, RegExp][] = [
    ["agent.json", () => parseAgentConfig("a", { modle: "gpt" }), /unknown field modle \(known: name, persona, model/],
    ["routing.json", () => parseRouting('{"bindngs": []}', "routing.json"), /routing\.json: unknown field bindngs/],
    [
      "a binding",
      () => parseRouting('{"bindings": [{"agent": "a", "match": {"channel": "web", "guild": "g"}}]}', "r.json"),
      /bindings\[0\]\.match: unknown field guild/,
    ],
    [
      "the keys file",
      () => parseKeys(keysFile([{ tenant: "t", principal: "p", sha256: HASH, rol: "admin" }]), "k"),
      /keys\[0\]: unknown field rol/,
    ],
    [
      "the quotas file",
      () => parseQuotas('{"tenants": {"t1": {"liveSandbox": 3}}}', "q"),
      /tenants\.t1: unknown field liveSandbox/,
    ],
    [
      "the providers file",
      () => parseProviders('{"providers": {"o": {"kind": "openai", "baseUrl": "http://x", "apikey": "sk-1"}}}', "p"),
      /providers\.o: unknown field apikey/,
    ],
  ];
  for (const [what, parse, message] of cases) test(what, () => assert.throws(parse, message));
});

test("a document gets every problem at once, each with its place", () => {
  const doc = { contextWindow: 10, retry: { maxRetries: -1 }, fallbacks: "x", owners: [""] };
  assert.throws(
    () => parseAgentConfig("a", doc),
    (e: Error) =>
      /contextWindow must be an integer from 512 to 10000000/.test(e.message) &&
      /retry\.maxRetries must be an integer from 0 to 10/.test(e.message) &&
      /fallbacks must be a list of at most 20 non-empty strings/.test(e.message) &&
      /owners\[0\] must be a non-empty string/.test(e.message),
  );
});

test("an agent's workspace template names an image reference and a folder inside the agent's", () => {
  const workspace = { image: "troupe-sandbox:mcp", files: "starter/src" };
  assert.deepEqual(parseAgentConfig("a", { workspace }).workspace, workspace);
  for (const files of ["../elsewhere", "/etc", "a/../../b", "a/.."])
    assert.throws(() => parseAgentConfig("a", { workspace: { files } }), /workspace\.files must be a path inside/);
  assert.throws(
    () => parseAgentConfig("a", { workspace: { image: "-v /:/host" } }),
    /workspace\.image must be an image/,
  );
  assert.throws(
    () => parseAgentConfig("a", { workspace: { snapshot: "x" } }),
    /workspace\.snapshot must be a snapshot id/,
  );
  const snapshot = "snap-00000000-0000-4000-8000-000000000000";
  assert.deepEqual(parseAgentConfig("a", { workspace: { snapshot } }).workspace, { snapshot });
  assert.throws(() => parseAgentConfig("a", { workspace: { snapshot, files: "f" } }), /files and a snapshot/);
});

test("the parsers keep what a schema cannot say", () => {
  const adapterless = keysFile([{ tenant: "t", principal: "p", sha256: HASH, channels: ["web"] }]);
  assert.throws(() => parseKeys(adapterless, "k"), /keys\[0\]\.channels is for adapter keys only/);
  const twice = keysFile([
    { id: "a", tenant: "t", principal: "p", sha256: HASH },
    { id: "a", tenant: "t", principal: "q", sha256: HASH },
  ]);
  assert.throws(() => parseKeys(twice, "k"), /keys\[1\]\.id a is used twice/);
  assert.throws(
    () => parseKeys(keysFile([{ tenant: "t", principal: "telegram:1", sha256: HASH }]), "k"),
    /principal must be/,
  );
  assert.throws(
    () => parseQuotas('{"defaults": {"stepsPerRun": 0}}', "q"),
    /defaults\.stepsPerRun must be a positive integer/,
  );
  assert.throws(
    () => parseAgentConfig("a", { reserveTokens: 9000, contextWindow: 8000 }),
    /must be below contextWindow/,
  );
  const ok = parseQuotas('{"defaults": {"stepsPerRun": 5}, "tenants": {"t1": {"liveSandboxes": 2}}}', "q");
  assert.deepEqual([ok.defaults, Object.fromEntries(ok.tenants)], [{ stepsPerRun: 5 }, { t1: { liveSandboxes: 2 } }]);
  assert.deepEqual(parseKeys(keysFile([{ tenant: "t", principal: "p", sha256: HASH }]), "k"), [
    { id: "key-0", tenant: "t", principal: "p", role: "user", channels: [], sha256: HASH },
  ]);
});

describe("troupe config validate", () => {
  const run = async (args: string[]) => {
    let out = "";
    let err = "";
    const code = await configCommand(["validate", ...args], { out: (t) => (out += t), err: (t) => (err += t) });
    return { code, out, err };
  };

  test("a valid file of each kind, its kind told by its name or --kind", async (t) => {
    const dir = await tempDir(t, "troupe-validate-");
    await mkdir(path.join(dir, "ada"));
    const files: [string, string][] = [
      [path.join(dir, "ada", "agent.json"), '{"name": "Ada", "retry": {"maxRetries": 1}}'],
      [
        path.join(dir, "routing.json"),
        '{"defaultAgent": "ada", "bindings": [{"agent": "ada", "match": {"channel": "web"}}]}',
      ],
      [path.join(dir, "api-keys.json"), keysFile([{ tenant: "t", principal: "p", sha256: HASH }])],
      [path.join(dir, "quotas.json"), '{"defaults": {"concurrentRuns": 3}}'],
    ];
    for (const [file, text] of files) {
      await writeFile(file, text);
      const r = await run([file]);
      assert.equal(r.code, 0, r.err);
      assert.match(r.out, new RegExp(`a valid ${kindOf(file)} file`));
    }
    const other = path.join(dir, "tenant-limits.json");
    await writeFile(other, '{"tenants": {"t1": {"liveSandboxes": 1}}}');
    assert.equal((await run([other])).code, 2, "a name that says nothing needs --kind");
    assert.equal((await run([other, "--kind", "quotas"])).code, 0);
  });

  test("an invalid file: exit 1 and every problem; a missing one or a wrong call says so", async (t) => {
    const dir = await tempDir(t, "troupe-validate-");
    const file = path.join(dir, "routing.json");
    await writeFile(file, '{"defaultAgent": "Not An Id", "session": {"dmScope": "per-galaxy"}}');
    const bad = await run([file]);
    assert.equal(bad.code, 1);
    assert.match(bad.err, /defaultAgent is not a valid agent id/);
    assert.match(bad.err, /session\.dmScope must be one of main, per-peer/);
    await writeFile(file, "{ nope");
    assert.match((await run([file])).err, /not JSON/);
    const missing = await run([path.join(dir, "nothing", "agent.json")]);
    assert.deepEqual([missing.code, /ENOENT/.test(missing.err)], [1, true]);
    assert.equal((await run([])).code, 2);
    assert.equal((await run([file, "--kind", "colour"])).code, 2);
  });

  test("a routing that shares direct messages is valid, with a warning naming each place", async (t) => {
    const dir = await tempDir(t, "troupe-validate-");
    const file = path.join(dir, "routing.json");
    await writeFile(
      file,
      JSON.stringify({
        session: { dmScope: "main" },
        bindings: [{ agent: "a", match: { channel: "telegram" }, dmScope: "main" }],
      }),
    );
    const shared = await run([file]);
    assert.equal(shared.code, 0);
    assert.match(shared.err, /warning: .*session\.dmScope is main: every direct message goes to one shared session/);
    assert.match(shared.err, /warning: .*bindings\[0\]\.dmScope is main: every direct message on telegram/);
    await writeFile(file, JSON.stringify({ session: { dmScope: "per-peer" } }));
    assert.equal((await run([file])).err, "", "no warning for private DMs");
  });

  test("troupe config schema prints a schema; an unknown name is a usage error", async () => {
    let out = "";
    const io = { out: (t: string) => (out += t), err: () => undefined };
    assert.equal(await configCommand(["schema", "routing"], io), 0);
    assert.equal(JSON.parse(out).title, "routing.json");
    assert.equal(await configCommand(["schema", "nope"], io), 2);
  });
});
