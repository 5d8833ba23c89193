// Which allocator troupe up hands its services: jemalloc preloaded where installed (auto), always
// (jemalloc, an error where it is missing), or glibc's (system); an operator's own LD_PRELOAD and
// MALLOC_CONF are kept.
import { test } from "node:test";
import assert from "node:assert/strict";
import { JEMALLOC_CONF, allocatorEnvironment, hasJemalloc } from "../../services/cli/allocator.js";
import { jitFlags, missingFlags } from "../../services/cli/jit.js";
import { DEFERRING_FLAGS } from "../../services/shared/process/deferred-tiering.js";
import { loadConfig } from "../../services/shared/config/config.js";

const DEBIAN = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const installed = (file: string) => file === DEBIAN;
const missing = () => false;

test("auto and jemalloc preload the installed library with a purging thread", () => {
  for (const choice of ["auto", "jemalloc"] as const) {
    const env = allocatorEnvironment(choice, { PATH: "/bin" }, installed);
    assert.equal(env.LD_PRELOAD, DEBIAN);
    assert.equal(env.MALLOC_CONF, JEMALLOC_CONF);
    assert.equal(env.PATH, "/bin");
    assert.ok(hasJemalloc(env));
  }
});

test("system, or auto without the library, leaves the environment as it is", () => {
  const given = { PATH: "/bin" };
  assert.equal(allocatorEnvironment("system", given, installed), given);
  assert.equal(allocatorEnvironment("auto", given, missing), given);
  assert.ok(!hasJemalloc(given));
});

test("jemalloc asked for but not installed is an error that says how to install it", () => {
  assert.throws(
    () => allocatorEnvironment("jemalloc", {}, missing),
    /TROUPE_ALLOCATOR=jemalloc.*apt-get install libjemalloc2/,
  );
});

test("the operator's preload and jemalloc settings are kept", () => {
  const own = allocatorEnvironment("auto", { LD_PRELOAD: "/opt/trace.so", MALLOC_CONF: "narenas:2" }, installed);
  assert.equal(own.LD_PRELOAD, `/opt/trace.so ${DEBIAN}`);
  assert.equal(own.MALLOC_CONF, "narenas:2");
  const already = { LD_PRELOAD: "/opt/jemalloc/lib/libjemalloc.so.2" };
  assert.equal(allocatorEnvironment("jemalloc", already, missing), already, "a jemalloc of its own is not doubled");
});

test("TROUPE_ALLOCATOR takes only the three choices", () => {
  assert.equal(loadConfig([], {}).allocator, "auto");
  assert.equal(loadConfig([], { TROUPE_ALLOCATOR: "system" }).allocator, "system");
  assert.throws(
    () => loadConfig([], { TROUPE_ALLOCATOR: "tcmalloc" }),
    /TROUPE_ALLOCATOR must be one of auto, jemalloc, system/,
  );
});

test("V8's tiers: router interpreted, sandbox up to Maglev, gateway deferred; lean defers more; on gives all; a flag given wins", () => {
  for (const choice of ["auto", "lean"] as const) {
    assert.deepEqual(jitFlags("router", choice), ["--max-opt=0"], choice);
    assert.deepEqual(jitFlags("gateway", choice), DEFERRING_FLAGS, choice);
  }
  assert.deepEqual(jitFlags("sandbox", "auto"), ["--max-opt=2"]);
  assert.deepEqual(jitFlags("sandbox", "lean"), ["--max-opt=0"]);
  for (const service of ["runner", "memory"]) {
    assert.deepEqual(jitFlags(service, "auto"), [], service);
    assert.deepEqual(jitFlags(service, "lean"), DEFERRING_FLAGS, service);
  }
  for (const service of ["model-server", "adapter"]) assert.deepEqual(jitFlags(service, "lean"), [], service);
  for (const service of ["router", "sandbox", "gateway", "runner"])
    assert.deepEqual(jitFlags(service, "on"), [], service);
  assert.deepEqual(missingFlags(["--max-opt=0"], ["--expose-gc"]), ["--max-opt=0"]);
  assert.deepEqual(missingFlags(["--max-opt=0"], ["--max-opt=0"]), [], "already started with it: no start over");
  assert.deepEqual(missingFlags(["--max-opt=0"], ["--max_opt=3"]), [], "the operator's own value wins");
  assert.deepEqual(
    missingFlags(["--no-maglev", "--no-turbofan"], ["--maglev"]),
    ["--no-turbofan"],
    "and their own tier",
  );
});
