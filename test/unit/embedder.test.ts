// The memory service's remote embedder against an embeddings server written from OpenAI's reference
// (test/helpers/embeddings-api.ts): what it sends is accepted, what it gets back is checked, and a
// provider's refusal reaches the caller as UNAVAILABLE with nothing stored.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { OpenAIEmbedder, normalise } from "../../services/memory/embedder.js";
import { RpcError, Status } from "../../services/shared/errors.js";
import { EmbeddingsApiServer, vectorOf } from "../helpers/embeddings-api.js";

const KEY = "sk-embeddings-test";
let api: EmbeddingsApiServer;
before(async () => {
  api = await new EmbeddingsApiServer(KEY).start();
});
after(() => api.close());

const embedder = (over: { key?: string; model?: string; dim?: number } = {}) =>
  new OpenAIEmbedder(api.baseUrl, over.key ?? KEY, over.model ?? "text-embedding-3-small", over.dim ?? 1536);

async function refusal(promise: Promise<unknown>): Promise<RpcError> {
  const err = await promise.then(
    () => assert.fail("the call succeeded"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof RpcError, `not an RpcError: ${err}`);
  return err;
}

describe("the remote embedder", () => {
  test("each text gets its own vector, in order, normalised; the request is one the API accepts", async () => {
    const texts = ["the user likes tea", "their cat is called Miso", "they live in Lyon"];
    const before = api.accepted.length;
    const vectors = await embedder().embed(texts);
    assert.equal(api.accepted.length, before + 1);
    assert.deepEqual(api.accepted.at(-1), {
      model: "text-embedding-3-small",
      input: texts,
      encoding_format: "float",
    });
    assert.equal(vectors.length, 3);
    for (const [i, t] of texts.entries()) assert.deepEqual(vectors[i], normalise(vectorOf(t, 1536)));
  });

  test("rate limited once: one more try after the Retry-After, and the vectors come", async () => {
    api.outage = { status: 429, retryAfterSeconds: 1, count: 1 };
    const before = api.requests;
    const started = Date.now();
    const vectors = await embedder().embed(["a fact"]);
    assert.equal(vectors.length, 1);
    assert.equal(api.requests, before + 2);
    assert.ok(Date.now() - started >= 900, "waited for the Retry-After");
  });

  test("overloaded twice: UNAVAILABLE after the second try, naming the provider's words", async () => {
    api.outage = { status: 503, retryAfterSeconds: 0, count: 2 };
    const before = api.requests;
    const err = await refusal(embedder().embed(["a fact"]));
    assert.equal(err.code, Status.UNAVAILABLE);
    assert.match(err.message, /overloaded/);
    assert.match(err.message, /nothing was stored/);
    assert.equal(api.requests, before + 2);
    api.outage = undefined;
  });

  test("a wrong key: UNAVAILABLE at once, not retried, the key not quoted", async () => {
    const before = api.requests;
    const err = await refusal(embedder({ key: "sk-not-the-key" }).embed(["a fact"]));
    assert.equal(err.code, Status.UNAVAILABLE);
    assert.match(err.message, /Incorrect API key/);
    assert.doesNotMatch(err.message, /sk-not-the-key/);
    assert.equal(api.requests, before + 1);
  });

  test("a model of another size than configured: FAILED_PRECONDITION, nothing returned", async () => {
    const err = await refusal(embedder({ model: "text-embedding-3-large", dim: 1536 }).embed(["a fact"]));
    assert.equal(err.code, Status.FAILED_PRECONDITION);
    assert.match(err.message, /3072 dimensions, not the configured 1536/);
  });

  test("a model the provider does not have: UNAVAILABLE naming it", async () => {
    const err = await refusal(embedder({ model: "text-embedding-4" }).embed(["a fact"]));
    assert.equal(err.code, Status.UNAVAILABLE);
    assert.match(err.message, /text-embedding-4/);
  });
});
