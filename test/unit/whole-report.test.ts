// Every verdict reaches the test runner's report (test/helpers/whole-report.ts): 20 files of 50
// fast tests, run as make test runs its tiers (--test-force-exit, in child processes), must be
// counted 1,000. Without the preload, Node 24 counted 947 of them in one run here.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";
import { tempDir } from "../helpers/tempdir.js";

const run = promisify(execFile);
const preload = fileURLToPath(new URL("../helpers/whole-report.js", import.meta.url));
const FILES = 20;
const TESTS = 50;

test("with the preload, a forced exit loses no verdict of any file", async (t) => {
  const dir = await tempDir(t, "whole-report-");
  for (let f = 0; f < FILES; f++) {
    const tests = Array.from(
      { length: TESTS },
      (_, t) => `test(${JSON.stringify(`t${t} ${"x".repeat(2000)}`)}, () => {});`,
    );
    await writeFile(path.join(dir, `f${f}.test.mjs`), `import { test } from "node:test";\n${tests.join("\n")}\n`);
  }
  // A runner of its own, not one reporting to this file's runner.
  const { NODE_TEST_CONTEXT: _, ...runnerEnv } = process.env;
  for (const concurrency of ["--test-concurrency=1", "--test-concurrency=2"]) {
    const { stdout } = await run(
      process.execPath,
      ["--test", "--test-force-exit", concurrency, "--test-reporter=spec", "--import", preload, "f*.test.mjs"],
      { cwd: dir, maxBuffer: 64 * 1024 * 1024, env: runnerEnv },
    );
    assert.match(
      stdout,
      new RegExp(`ℹ tests ${FILES * TESTS}\\n`),
      `${concurrency}: ${/ℹ tests \d+/.exec(stdout)?.[0]}`,
    );
  }
});

test("both tiers of make test preload it", async () => {
  const makefile = await readFile(new URL("../../../Makefile", import.meta.url), "utf8");
  const runs = makefile.split("\n").filter((l) => /^\tnode --test\b/.test(l) && l.includes("--test-force-exit"));
  assert.ok(runs.length >= 3, "make test-unit, and make test's two tiers");
  for (const line of runs) assert.match(line, /--import \.\/dist\/test\/helpers\/whole-report\.js/, line);
});
