// Optimization deferred while a service starts (shared/deferred-tiering.ts), checked in child
// processes by V8's own account of what it compiles (--trace-opt).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmod, writeFile } from "node:fs/promises";
import path from "node:path";
import { DEFERRING_FLAGS, THRESHOLDS, thresholdsKnown } from "../../services/shared/deferred-tiering.js";
import { tempDir } from "../helpers/tempdir.js";

const MODULE = new URL("../../services/shared/deferred-tiering.js", import.meta.url).href;

test("the thresholds put back are V8's own defaults in this Node", () => {
  const options = spawnSync(process.execPath, ["--v8-options"], { encoding: "utf8" }).stdout;
  for (const t of THRESHOLDS) {
    const stated = new RegExp(`default: ${t.flag}=(\\d+)`).exec(options);
    assert.ok(stated, `${t.flag} is a flag of this V8`);
    assert.equal(Number(stated[1]), t.usual, t.flag);
    assert.ok(t.starting >= t.usual * 30, `${t.flag} is raised well past its default`);
  }
});

test("lean is used only where the Node's V8 has the flags at those defaults", async (t) => {
  assert.equal(thresholdsKnown(), true, "this Node (the toolchain's Node 24)");
  // What Node 20's V8 says: two of the flags only, one of them at another default.
  const dir = await tempDir(t, "troupe-v8-");
  const older = path.join(dir, "node");
  const said =
    "  --invocation-count-for-maglev (interrupt budget)\n        type: int  default: --invocation-count-for-maglev=100\n";
  await writeFile(older, `#!/bin/sh\nprintf '${said}'\n`);
  await chmod(older, 0o755);
  assert.equal(thresholdsKnown(older), false);
});

/**
 * A child that calls a function 20,000 times (Maglev's default is 400), then resumes at its first
 * second (busy share 0) and calls another 20,000 times; what V8 compiled, in order, and what the
 * child printed.
 */
function child(flags: string[]): string[] {
  const script = `
    import { resumeOptimizationOnceBusy } from ${JSON.stringify(MODULE)};
    const run = (f) => { let s = 0; for (let i = 0; i < 20000; i++) s += f(i); return s; };
    function startOnly(n) { return (n * 7) % 13; }
    function afterResume(n) { return (n * 11) % 17; }
    run(startOnly);
    console.log("MARK start done");
    const keepAlive = setTimeout(() => {}, 2500);
    resumeOptimizationOnceBusy(() => {
      console.log("MARK resumed");
      run(afterResume);
      setTimeout(() => clearTimeout(keepAlive), 200);
    }, process.execArgv, 0);
  `;
  const r = spawnSync(process.execPath, ["--trace-opt", ...flags, "--input-type=module", "-e", script], {
    encoding: "utf8",
    timeout: 20_000,
  });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout
    .split("\n")
    .map((l) => /^MARK (.*)/.exec(l)?.[1] ?? /compiling method .*<JSFunction (startOnly|afterResume) /.exec(l)?.[1])
    .filter((l): l is string => l !== undefined);
}

test("started deferred, code hot during the start is not optimized; code hot after the resume is", () => {
  const seen = child([...DEFERRING_FLAGS]);
  assert.ok(!seen.includes("startOnly"), seen.join(", "));
  assert.deepEqual(seen.slice(0, 2), ["start done", "resumed"]);
  assert.ok(seen.includes("afterResume"), seen.join(", "));
});

test("started at V8's defaults, nothing is changed: the start's hot code is optimized, and no resume comes", () => {
  const seen = child([]);
  assert.ok(seen.indexOf("startOnly") < seen.indexOf("start done"), seen.join(", "));
  assert.ok(!seen.includes("resumed"), "nothing deferred, nothing to resume");
});

test("a process that stays nearly idle stays deferred; one busy a quarter of a second resumes", () => {
  /** Whether a deferred child resumes within 2.5 s while busy `busyMs` of every 1,000 ms. */
  const resumes = (busyMs: number) => {
    const script = `
      import { resumeOptimizationOnceBusy } from ${JSON.stringify(MODULE)};
      const spin = setInterval(() => { const end = Date.now() + ${busyMs}; while (Date.now() < end); }, 1000);
      setTimeout(() => clearInterval(spin), 2500);
      resumeOptimizationOnceBusy((share) => console.log("resumed at", share.toFixed(2)));
    `;
    const r = spawnSync(process.execPath, [...DEFERRING_FLAGS, "--input-type=module", "-e", script], {
      encoding: "utf8",
      timeout: 20_000,
    });
    assert.equal(r.status, 0, r.stderr);
    return /resumed at/.test(r.stdout);
  };
  assert.equal(resumes(20), false, "2 % of each second (the gateway's start and a tool turn: under 5 %)");
  assert.equal(resumes(500), true, "half of each second");
});
