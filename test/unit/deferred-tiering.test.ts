// Optimization deferred while a service starts (shared/process/deferred-tiering.ts), checked in child
// processes by V8's own account of what it compiles (--trace-opt).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { DEFERRING_FLAGS } from "../../services/shared/process/deferred-tiering.js";

const MODULE = new URL("../../services/shared/process/deferred-tiering.js", import.meta.url).href;

/**
 * A child that calls `startOnly` and `both` 20,000 times each (Maglev's threshold is 400), then
 * resumes at its first second (busy share 0), calls `both` 5,000 times more and `afterResume`
 * 20,000 times; what V8 compiled, in order, and what the child printed.
 */
function child(flags: string[]): string[] {
  const script = `
    import { resumeOptimizationOnceBusy } from ${JSON.stringify(MODULE)};
    const run = (f, k) => { let s = 0; for (let i = 0; i < k; i++) s += f(i); return s; };
    function startOnly(n) { return (n * 7) % 13; }
    function both(n) { return (n * 5) % 11; }
    function afterResume(n) { return (n * 11) % 17; }
    run(startOnly, 20000);
    run(both, 20000);
    console.log("MARK start done");
    const keepAlive = setTimeout(() => {}, 2500);
    resumeOptimizationOnceBusy(() => {
      console.log("MARK resumed");
      run(both, 5000);
      console.log("MARK both again");
      run(afterResume, 20000);
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
    .map(
      (l) => /^MARK (.*)/.exec(l)?.[1] ?? /compiling method .*<JSFunction (startOnly|both|afterResume) /.exec(l)?.[1],
    )
    .filter((l): l is string => l !== undefined);
}

test("started deferred, code hot during the start is not optimized; code hot after the resume is", () => {
  const seen = child([...DEFERRING_FLAGS]);
  assert.ok(!seen.includes("startOnly"), seen.join(", "));
  assert.deepEqual(seen.slice(0, 2), ["start done", "resumed"]);
  assert.ok(seen.includes("afterResume"), seen.join(", "));
  // Code the start also ran is optimized at V8's usual budgets, within 5,000 calls of the resume
  // (stop 54's raised thresholds left it a 100,000-call budget set during the start).
  assert.ok(seen.indexOf("both") > 1 && seen.indexOf("both") < seen.indexOf("both again"), seen.join(", "));
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
