// What a provider refuses by name (runner/providers/request-fixes.ts), and the rules by model name
// (shared/models/model-rules.ts) that make most refusals unnecessary.
import { test } from "node:test";
import assert from "node:assert/strict";
import { rulesFor } from "../../services/shared/models/model-rules.js";
import { ProviderRefusal } from "../../services/shared/models/provider-post.js";
import { MAX_FIXES_PER_CALL, postFitted, RequestFixes } from "../../services/runner/providers/request-fixes.js";

const refusal = (param: string, code = "unsupported_parameter", message = `Unsupported parameter: '${param}'.`) =>
  new ProviderRefusal(400, message, new Headers(), code, param);

test("OpenAI's families get OpenAI's rules behind any base URL, prefixed or not; others keep max_tokens", () => {
  for (const model of ["gpt-5-mini", "openai/gpt-5-mini", "o4-mini", "azure/o3"]) {
    const rules = rulesFor("openai-compatible", model);
    assert.equal(rules.maxTokensField, "max_completion_tokens", model);
    assert.equal(rules.sampling, false, model);
  }
  assert.equal(rulesFor("openai-compatible", "gpt-5.1-chat-latest").sampling, true);
  for (const model of ["llama3.1:8b", "meta-llama/Llama-3.1-8B", "gpt-4o-mini", "ollama/oss"])
    assert.equal(rulesFor("openai-compatible", model).maxTokensField, "max_tokens", model);
});

test("a refused field is renamed to the replacement the message names, or dropped; per model", () => {
  const fixes = new RequestFixes("p");
  const body = { model: "m", max_tokens: 5, temperature: 0.2 };
  const use =
    "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.";
  assert.equal(fixes.learn("m", refusal("max_tokens", "unsupported_parameter", use), body), true);
  assert.equal(fixes.learn("m", refusal("temperature", "unsupported_value"), body), true);
  assert.deepEqual(fixes.apply("m", body), { model: "m", max_completion_tokens: 5 });
  assert.equal(fixes.apply("other", body), body, "another model is untouched");
  // Learned once: the same refusal again teaches nothing (the caller gives up).
  assert.equal(fixes.learn("m", refusal("max_tokens"), body), false);
});

test("what teaches nothing: other statuses and codes, no param, a field not sent, a nested one", () => {
  const fixes = new RequestFixes("p");
  const body = { model: "m", max_tokens: 5, reasoning: { effort: "low" } };
  assert.equal(
    fixes.learn("m", new ProviderRefusal(401, "no", new Headers(), "invalid_api_key", "max_tokens"), body),
    false,
  );
  assert.equal(fixes.learn("m", refusal("max_tokens", "invalid_value"), body), false);
  assert.equal(fixes.learn("m", new ProviderRefusal(400, "x", new Headers(), "unsupported_parameter"), body), false);
  assert.equal(fixes.learn("m", refusal("top_p"), body), false);
  assert.equal(fixes.learn("m", refusal("reasoning.effort"), body), false);
  assert.equal(fixes.apply("m", body), body);
});

test("postFitted sends again after each lesson, at most MAX_FIXES_PER_CALL times", async () => {
  const sent: object[] = [];
  const fields = ["a", "b", "c", "d", "e"];
  const post = async (_path: string, body: unknown) => {
    sent.push(body as object);
    const refused = fields.find((f) => f in (body as object));
    if (refused) throw refusal(refused);
    return new Response("ok");
  };
  const body = Object.fromEntries(fields.map((f) => [f, 1]));
  await assert.rejects(
    postFitted(post, new RequestFixes("p"), "/x", "m", body, AbortSignal.timeout(1000)),
    ProviderRefusal,
  );
  assert.equal(sent.length, MAX_FIXES_PER_CALL + 1);
  const two = { a: 1, b: 1, keep: 1 };
  sent.length = 0;
  const fixes = new RequestFixes("p");
  assert.equal((await postFitted(post, fixes, "/x", "m", two, AbortSignal.timeout(1000))).status, 200);
  assert.deepEqual(sent, [two, { b: 1, keep: 1 }, { keep: 1 }]);
});
