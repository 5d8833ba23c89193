// Every verdict reaches the test runner's report, and the report its reader
// (test/helpers/whole-report.ts): 20 files of 50 fast tests, run as make test runs its tiers
// (--test-force-exit, in child processes), must be counted 1,000 in the report's summary, read as
// slowly as a loaded CI's log reads it. Without the preload Node 24 counted 947 of them in one run
// here, and with it loaded by --import the slow reader never got the summary.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
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
    const stdout = await readSlowly(
      ["--test", "--test-force-exit", concurrency, "--test-reporter=spec", "--require", preload, "f*.test.mjs"],
      { cwd: dir, env: runnerEnv },
    );
    assert.match(
      stdout,
      new RegExp(`ℹ tests ${FILES * TESTS}\\n`),
      `${concurrency}: ${/ℹ tests \d+/.exec(stdout)?.[0]}`,
    );
  }
});

// A forced exit waited forever on a background Maglev or Sparkplug compile (nodejs/node#64274):
// 1 exit in 10 of this file under load, 87 minutes in CI. Whether a compile runs in the
// background cannot be seen from JavaScript, but Maglev can: it is off in a process started as
// the runner starts a test file, and on without the preload.
test("in a test file's process, no compile that allocates runs in the background", async (t) => {
  const dir = await tempDir(t, "whole-report-");
  const probe = path.join(dir, "probe.cjs");
  await writeFile(
    probe,
    `function f(a) { return a + 1; }
%PrepareFunctionForOptimization(f); f(1); f(2);
%OptimizeMaglevOnNextCall(f); f(3);
process.stdout.write((%GetOptimizationStatus(f) & (1 << 5)) ? "maglev" : "interpreted");\n`,
  );
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  const probeWith = async (preload: string[], context: NodeJS.ProcessEnv) =>
    (await run(process.execPath, ["--allow-natives-syntax", ...preload, probe], { env: { ...env, ...context } }))
      .stdout;
  assert.equal(await probeWith(["--require", preload], { NODE_TEST_CONTEXT: "child-v8" }), "interpreted");
  assert.equal(await probeWith([], { NODE_TEST_CONTEXT: "child-v8" }), "maglev");
});

/** The stdout of `node args`, read at 4 KB per 2 ms (2 MB/s). */
async function readSlowly(args: string[], options: { cwd: string; env: NodeJS.ProcessEnv }): Promise<string> {
  const child = spawn(process.execPath, args, { ...options, stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  const chunks: Buffer[] = [];
  for await (const chunk of child.stdout as AsyncIterable<Buffer>) {
    chunks.push(chunk);
    await new Promise((r) => setTimeout(r, Math.ceil((2 * chunk.length) / 4096)));
  }
  assert.equal(await exited, 0);
  return Buffer.concat(chunks).toString("utf8");
}

test("every forced-exit run in the Makefile preloads it", async () => {
  const root = fileURLToPath(new URL("../../../", import.meta.url));
  const makefile = await readFile(path.join(root, "Makefile"), "utf8");
  // --test-force-exit is spelled once, in NODE_TEST, so no run can force an exit without it.
  const forced = makefile.split("\n").filter((l) => l.includes("--test-force-exit") && !l.startsWith("#"));
  assert.deepEqual(
    forced.map((l) => l.split(" ")[0]),
    ["NODE_TEST"],
    `lines with --test-force-exit: ${forced.join(" | ")}`,
  );
  // What make itself expands, for the variable and for the unit tier built on it.
  const expand = async (name: string) =>
    (
      await run("make", ["-s", "--no-print-directory", "--eval", "show-%: ; @echo $($*)", `show-${name}`], {
        cwd: root,
      })
    ).stdout.trim();
  for (const name of ["NODE_TEST", "UNIT_TIER"]) {
    const command = await expand(name);
    assert.match(command, /^node --test .*--test-force-exit/, `${name}: ${command}`);
    assert.match(command, /--require \.\/dist\/test\/helpers\/whole-report\.js/, `${name}: ${command}`);
  }
  // Both tiers of make test, and make test-unit, run through it.
  const recipe = (target: string) => {
    const start = makefile.indexOf(`\n${target}:`);
    const end = makefile.indexOf("\n\n", start + 1);
    return makefile.slice(start, end === -1 ? undefined : end);
  };
  assert.match(recipe("test-unit"), /\n\t\$\(UNIT_TIER\)/);
  assert.match(recipe("test"), /\n\t\$\(UNIT_TIER\)/);
  assert.match(recipe("test"), /\$\(NODE_TEST\) --test-concurrency=1 .*'dist\/test\/\*\.test\.js'/);
});
