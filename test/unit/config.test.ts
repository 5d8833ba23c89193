// The configuration: the one module that reads the environment, and what it says about it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { ENVIRONMENT, effectiveEnvironment, loadConfig, unknownVariables } from "../../services/shared/config.js";

test("settings come from the environment, checked; a bad value names its variable", () => {
  const cfg = loadConfig([], {
    TROUPE_LOG_LEVEL: "debug",
    TROUPE_MEMORY_LEARN: "0",
    TROUPE_QUOTA_STEPS_PER_RUN: "7",
    TROUPE_TENANT_RATE: "5",
  });
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
  assert.ok(ENVIRONMENT.some((e) => e.name === "TROUPE_QUOTA_LIVE_SANDBOXES"));
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
  assert.deepEqual(readers, ["shared/config.ts"]);
  const config = await readFile(path.join(root, "shared/config.ts"), "utf8");
  const declared = new Set(ENVIRONMENT.map((e) => e.name));
  for (const [, name] of config.matchAll(/env\.([A-Z][A-Z0-9_]+)/g))
    assert.ok(declared.has(name), `${name} is read but not declared`);
});
