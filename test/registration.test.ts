// A runner's registration with the router as an operator reads it in the logs: a router that is
// still starting is not worth a warning (services started together come up in any order), one
// that stays away is, and the registration that follows says so.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  // The runner alone (startStack would wait for it to register).
  stack = await startStack({ services: ["model-server"] });
});
after(async () => {
  await stack?.stop();
});

const count = (re: RegExp) => stack.logs().match(new RegExp(re, "g"))?.length ?? 0;

test("a router away for seconds is warned about once, and the registration that follows is logged", async () => {
  const started = Date.now();
  await stack.start("runner");
  await new Promise((r) => setTimeout(r, Math.max(0, started + 1500 - Date.now())));
  assert.equal(count(/cannot reach the router/), 0, "no warning while the router may still be starting");
  await waitFor("the warning", async () => count(/cannot reach the router for \d+ s; retrying/) === 1, 10_000);
  assert.ok(Date.now() - started >= 2900, "warned after about 3 s");
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(count(/cannot reach the router/), 1, "warned once, not at every retry");
  await stack.start("router");
  await waitFor("the registration", async () => /runner: registered with the router\b/.test(stack.logs()), 10_000);
  assert.doesNotMatch(stack.logs(), /registered with the router again/, "the first registration is not 'again'");
});
