// The configuration: the one module that reads the environment, and what it says about it.
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import {
  ENVIRONMENT,
  effectiveEnvironment,
  loadConfig,
  unknownVariables,
} from "../../services/shared/config/config.js";
import { DEFAULT_QUOTAS } from "../../services/shared/auth/quotas.js";
import { int, oneOf, positive, type Setting, settingsChecker } from "../../services/shared/config/setting-kinds.js";
import { settingsTable } from "../../services/shared/config/settings.js";

test("settings come from the environment, checked; a bad value names its variable", () => {
  const cfg = loadConfig([], {
    TROUPE_LOG_LEVEL: "debug",
    TROUPE_MEMORY_LEARN: "0",
    TROUPE_QUOTA_STEPS_PER_RUN: "7",
    TROUPE_TENANT_RATE: "5",
    OPENAI_ORG_ID: "org-abc",
  });
  assert.deepEqual(cfg.openaiAccount, { organization: "org-abc", project: undefined });
  assert.equal(cfg.logLevel, "debug");
  assert.equal(cfg.memoryLearn, false);
  assert.equal(cfg.quotaDefaults.stepsPerRun, 7);
  assert.equal(cfg.limits.tenantRate, 5);
  assert.throws(
    () => loadConfig([], { TROUPE_LOG_LEVEL: "loud" }),
    /TROUPE_LOG_LEVEL must be one of debug, info, warn, error/,
  );
  assert.throws(() => loadConfig([], { TROUPE_EMBEDDING_MODEL: "m" }), /TROUPE_EMBEDDING_DIM/);
  assert.throws(
    () => loadConfig([], { TROUPE_MEMORY_STORAGE_OPTIONS: "[1]" }),
    /TROUPE_MEMORY_STORAGE_OPTIONS must be a JSON object/,
  );
  assert.throws(() => loadConfig([], { TROUPE_TENANT_RATE: "-1" }), /TROUPE_TENANT_RATE must be a positive number/);
  assert.throws(
    () => loadConfig([], { TROUPE_QUOTA_STEPS_PER_RUN: "0" }),
    /TROUPE_QUOTA_STEPS_PER_RUN must be a positive integer/,
  );
  const net = loadConfig([], { TROUPE_NET_PORTS: "443,8443", TROUPE_NET_ALLOW: "10.9.0.0/16, fd12::/64" }).net;
  assert.deepEqual(net, { ports: [443, 8443], allow: ["10.9.0.0/16", "fd12::/64"] });
  assert.deepEqual(loadConfig([], {}).net, { ports: [80, 443], allow: [] });
  assert.throws(
    () => loadConfig([], { TROUPE_NET_PORTS: "80;443" }),
    /TROUPE_NET_PORTS must be ports separated by commas/,
  );
  assert.throws(() => loadConfig([], { TROUPE_NET_PORTS: "80,70000" }), /TROUPE_NET_PORTS: 70000 is not a port/);
  assert.throws(
    () => loadConfig([], { TROUPE_NET_ALLOW: "10.0.0.0/33" }),
    /TROUPE_NET_ALLOW: 10\.0\.0\.0\/33 is not a CIDR range/,
  );
  assert.throws(() => loadConfig([], { TROUPE_NET_ALLOW: "intranet" }), /TROUPE_NET_ALLOW: intranet is not a CIDR/);
  assert.throws(() => loadConfig(["--tls-key", "k.pem"], {}), /TROUPE_TLS_CERT and TROUPE_TLS_KEY go together/);
  const tls = loadConfig(["--tls-cert", "c.pem", "--tls-key", "k.pem", "--ca", "ca.pem"], {});
  assert.deepEqual(
    [tls.tls, tls.tlsCa],
    [{ certFile: path.resolve("c.pem"), keyFile: path.resolve("k.pem") }, path.resolve("ca.pem")],
  );
});

test("every bad setting is reported at once, named as it was given; a flag beats its variable", () => {
  assert.throws(
    () =>
      loadConfig(["--max-message-bytes", "big"], {
        TROUPE_MAX_MESSAGE_BYTES: "100",
        TROUPE_SANDBOX_SCOPE: "everyone",
        TROUPE_SANDBOX_POOL: "-1",
        TROUPE_IDLE_TRIM_MS: "soon",
      }),
    (e: Error) =>
      /--max-message-bytes must be a positive integer/.test(e.message) &&
      /TROUPE_SANDBOX_SCOPE must be one of session, agent, shared/.test(e.message) &&
      /TROUPE_SANDBOX_POOL must be an integer of at least 0/.test(e.message) &&
      /TROUPE_IDLE_TRIM_MS must be an integer of at least 0/.test(e.message),
  );
  assert.equal(loadConfig([], { TROUPE_IDLE_TRIM_MS: "0" }).idleTrimMs, 0, "0 turns trimming off");
  assert.equal(loadConfig([], {}).idleTrimMs, 5000);
  assert.equal(loadConfig([], {}).memoryMetadataCacheMb, 32);
  assert.throws(() => loadConfig([], { TROUPE_MEMORY_METADATA_CACHE_MB: "0" }), /must be a positive integer/);
  const cfg = loadConfig(["--max-message-bytes", "2048", "--data-dir", "/srv/troupe"], {
    TROUPE_MAX_MESSAGE_BYTES: "100",
    TROUPE_SANDBOX_POOL: "0",
    TROUPE_RUNNER_ADDR: "10.0.0.5:7000",
    TROUPE_ROUTING_FILE: "",
  });
  assert.equal(cfg.maxMessageBytes, 2048);
  assert.equal(cfg.sandboxPoolSize, 0);
  assert.equal(cfg.runnerId, "runner-10.0.0.5:7000", "a default worked out from another setting");
  assert.equal(cfg.routingFile, "/srv/troupe/routing.json", "an empty variable counts as unset");
  assert.deepEqual(loadConfig([], {}).quotaDefaults, DEFAULT_QUOTAS);
});

test("docs/settings.md's table is the one the settings make", async () => {
  const doc = await readFile(path.resolve(import.meta.dirname, "../../../docs/settings.md"), "utf8");
  const start = doc.indexOf("<!-- settings:start -->\n");
  const end = doc.indexOf("<!-- settings:end -->");
  assert.ok(start >= 0 && end > start, "docs/settings.md has the settings markers");
  assert.equal(
    doc.slice(start + "<!-- settings:start -->\n".length, end),
    settingsTable(),
    "docs/settings.md's table is stale: run make readme-settings",
  );
});

test("a TROUPE_* variable nobody reads is reported; secrets are masked in what troupe config prints", () => {
  assert.deepEqual(
    unknownVariables({ TROUPE_SANDBOX_RUNTIEM: "runsc", TROUPE_SANDBOX_RUNTIME: "runsc", PATH: "/bin" }),
    ["TROUPE_SANDBOX_RUNTIEM"],
  );
  const shown = effectiveEnvironment({ OPENAI_API_KEY: "sk-secret", TROUPE_MODEL: "m" });
  assert.equal(shown.find((e) => e.name === "OPENAI_API_KEY")?.value, "****");
  assert.equal(shown.find((e) => e.name === "TROUPE_MODEL")?.value, "m");
  assert.equal(shown.find((e) => e.name === "TROUPE_DATA_DIR")?.value, "(unset)");
  assert.ok(ENVIRONMENT.some((e) => e.env === "TROUPE_QUOTA_LIVE_SANDBOXES"));
});

test("no module but the configuration reads process.env, and every variable it reads is declared", async () => {
  const root = path.resolve(import.meta.dirname, "../../../services");
  const files: string[] = [];
  const walk = async (dir: string) => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      if (e.isDirectory() && e.name !== "gen") await walk(path.join(dir, e.name));
      else if (e.name.endsWith(".ts")) files.push(path.join(dir, e.name));
    }
  };
  await walk(root);
  const readers = [];
  for (const f of files) if ((await readFile(f, "utf8")).includes("process.env")) readers.push(path.relative(root, f));
  assert.deepEqual(readers, ["shared/config/config.ts"]);
  const config = await readFile(path.join(root, "shared/config/config.ts"), "utf8");
  const declared = new Set(ENVIRONMENT.map((e) => e.env));
  for (const [, name] of config.matchAll(/env\.([A-Z][A-Z0-9_]+)/g))
    assert.ok(declared.has(name), `${name} is read but not declared`);
});

test("a setting's shape: numbers from text, bounds, choices and patterns; a shape it cannot check is refused", () => {
  const table: [string, Setting][] = [
    ["count", { env: "C", doc: "", schema: int(0) }],
    ["ratio", { env: "R", doc: "", schema: { type: "number", minimum: 0, maximum: 1, message: "must be 0 to 1" } }],
    ["rate", { env: "T", doc: "", schema: positive }],
    ["mode", { env: "M", doc: "", schema: oneOf("a", "b") }],
    ["url", { env: "U", doc: "", schema: { type: "string", pattern: "^https://", message: "must be https" } }],
    ["name", { env: "N", doc: "" }],
  ];
  const check = settingsChecker(table);
  const good: Record<string, unknown> = { count: "12", ratio: "0.5", rate: 3, mode: "b", url: "https://x", name: "n" };
  assert.deepEqual(check(good), []);
  assert.deepEqual(
    good,
    { count: 12, ratio: 0.5, rate: 3, mode: "b", url: "https://x", name: "n" },
    "numbers as numbers",
  );
  for (const [name, value] of [
    ["count", "1.5"],
    ["count", "-1"],
    ["count", " "],
    ["count", "ten"],
    ["ratio", "1.01"],
    ["rate", "0"],
    ["rate", "Infinity"],
    ["mode", "c"],
    ["url", "http://x"],
  ] as const) {
    const values: Record<string, unknown> = { [name]: value };
    assert.equal(check(values).length, 1, `${name}=${JSON.stringify(value)} is refused`);
    assert.match(check(values)[0], new RegExp(`^${name} must`));
    assert.equal(values[name], value, "a refused value is left as given");
  }
  assert.throws(
    () =>
      settingsChecker([
        ["x", { env: "X", doc: "", schema: { type: "string", format: "uri", message: "m" } as Setting["schema"] }],
      ]),
    /setting x: cannot check format/,
  );
  assert.throws(() => settingsChecker([["x", { env: "X", doc: "", schema: { type: "integer" } }]]), /needs a message/);
});

test("checking the environment loads no JSON Schema validator: that waits for the first file checked", () => {
  const script = `
    import { createRequire } from "node:module";
    const { loadConfig } = await import(${JSON.stringify(new URL("../../services/shared/config/config.js", import.meta.url).href)});
    loadConfig([], { TROUPE_SANDBOX_POOL: "3" });
    const loaded = () => Object.keys(createRequire(import.meta.url).cache).some((k) => k.includes("/node_modules/ajv/") || k.endsWith(".validate.cjs"));
    const before = loaded();
    const { schemaProblems } = await import(${JSON.stringify(new URL("../../services/shared/json-schema.js", import.meta.url).href)});
    const problems = schemaProblems("quotas", { tenants: 1 });
    console.log(JSON.stringify({ before, after: loaded(), problems: problems.length }));`;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  assert.deepEqual(JSON.parse(out), { before: false, after: true, problems: 1 });
});
