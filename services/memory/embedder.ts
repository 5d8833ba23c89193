// What turns text into vectors. With an embedding model configured (TROUPE_EMBEDDING_MODEL and
// TROUPE_EMBEDDING_DIM, at OPENAI_BASE_URL or the scripted model server), OpenAI's embeddings
// endpoint (platform.openai.com/docs/api-reference/embeddings/create); without one, the built-in
// local embedder, so memory works offline. Vectors are L2-normalised either way (cosine = dot
// product), and a vector of the wrong dimension is an error, never stored.
import { openaiPoster } from "../shared/models/openai-sdk.js";
import { postForJson, type ProviderPost } from "../shared/models/provider-post.js";
import { SpanKind, SpanStatusCode } from "@opentelemetry/api";
import { RpcError, Status } from "../shared/errors.js";
import { GenAI, tracer } from "../shared/process/telemetry.js";
import { HASH_EMBEDDING_DIM, HASH_EMBEDDING_MODEL, hashEmbedding } from "../shared/models/hash-embedding.js";

export interface Embedder {
  /** Recorded with every vector: vectors of different embedders are never compared. */
  readonly name: string;
  readonly dim: number;
  embed(texts: string[]): Promise<Float32Array[]>;
}

export class LocalEmbedder implements Embedder {
  readonly name = HASH_EMBEDDING_MODEL;
  readonly dim = HASH_EMBEDDING_DIM;
  async embed(texts: string[]): Promise<Float32Array[]> {
    return texts.map((t) => hashEmbedding(t));
  }
}

/** The same embedder, each call a GenAI `embeddings` span (CLIENT when a model endpoint is called). */
export function traced(embedder: Embedder): Embedder {
  const remote = embedder instanceof OpenAIEmbedder;
  const model = embedder.name;
  return {
    name: embedder.name,
    dim: embedder.dim,
    async embed(texts) {
      const span = tracer.startSpan(`embeddings ${model}`, {
        kind: remote ? SpanKind.CLIENT : SpanKind.INTERNAL,
        attributes: {
          [GenAI.OPERATION_NAME]: "embeddings",
          [GenAI.PROVIDER_NAME]: remote ? "openai" : "troupe",
          [GenAI.REQUEST_MODEL]: model,
          "troupe.embeddings.inputs": texts.length,
        },
      });
      try {
        return await embedder.embed(texts);
      } catch (err) {
        span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
        throw err;
      } finally {
        span.end();
      }
    },
  };
}

export function normalise(v: ArrayLike<number>): Float32Array {
  const out = Float32Array.from(v);
  let n = 0;
  for (const x of out) n += x * x;
  n = Math.sqrt(n);
  if (n > 0) for (let i = 0; i < out.length; i++) out[i] /= n;
  return out;
}

/** One try of an embeddings call; a retryable failure gets one more (postForJson). */
const EMBED_TIMEOUT_MS = 30_000;
/**
 * The longest answer read for `texts` vectors of `dim` numbers: a number written as JSON takes at
 * most 25 characters ("-1.2345678901234567e-123,"), 48 leaves room for whitespace, and each item
 * has a few fields besides. More than that is a broken endpoint, not read into memory.
 */
const answerBound = (texts: number, dim: number) => texts * (dim * 48 + 1024) + 64 * 1024;

const unavailable = (why: string) =>
  new RpcError(Status.UNAVAILABLE, `the embedding endpoint failed (${why}); nothing was stored, retry later`);

export class OpenAIEmbedder implements Embedder {
  readonly name: string;
  private readonly post: ProviderPost;

  constructor(
    baseURL: string,
    apiKey: string,
    private readonly model: string,
    readonly dim: number,
    /** Sent with each request (OpenAI's account headers, providers.ts). */
    headers?: Readonly<Record<string, string>>,
  ) {
    this.name = `openai:${model}:${dim}`;
    this.post = openaiPoster({ baseUrl: baseURL, apiKey, headers }, fetch);
  }

  async embed(texts: string[]): Promise<Float32Array[]> {
    let data: unknown;
    try {
      const body = { model: this.model, input: texts, encoding_format: "float" };
      const answer = await postForJson(
        this.post,
        "/embeddings",
        body,
        EMBED_TIMEOUT_MS,
        answerBound(texts.length, this.dim),
      );
      data = (answer as { data?: unknown }).data;
    } catch (err) {
      // Nothing is stored without its vector: the caller gets UNAVAILABLE and may retry.
      throw unavailable((err as Error).message);
    }
    const items = Array.isArray(data) ? (data as { index?: unknown; embedding?: unknown }[]) : [];
    const vectors = items.every((d) => typeof d?.index === "number" && Array.isArray(d.embedding)) ? items : [];
    if (vectors.length !== texts.length)
      throw unavailable(`it answered ${vectors.length} vectors for ${texts.length} texts`);
    const out = vectors.sort((a, b) => (a.index as number) - (b.index as number)).map((d) => d.embedding as number[]);
    for (const v of out) {
      if (v.length !== this.dim)
        throw new RpcError(
          Status.FAILED_PRECONDITION,
          `the embedding model returned ${v.length} dimensions, not the configured ${this.dim}`,
        );
    }
    return out.map(normalise);
  }
}
