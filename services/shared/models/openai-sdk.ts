// OpenAI's kinds (openai, openai-compatible, openai-responses) are called through the `openai`
// SDK: it builds each request of Chat Completions, Responses, embeddings and models.retrieve, sets
// the key and its headers, and turns a refusal into its APIError; when OpenAI changes its API the
// SDK follows. What Troupe keeps for itself:
// - the HTTP client: the SDK is given a fetch (the runner's is over its pooled undici dispatcher,
//   pool-fetch.ts; the memory service's is Node's), and never retries (maxRetries 0): retries and
//   fallbacks belong to the agent loop, which knows whether output was already sent;
// - a refusal is read (16 KiB at most) and worded by errorOf, which knows the shapes compatible
//   servers answer with besides OpenAI's (sdk-calls.ts);
// - a streamed reply is taken as the raw Response (`asResponse`) and read by the runner's SSE
//   decoder, once per network read (bench/history.md, bench/stream: the SDK's Stream costs more).
// The SDK is imported on the first call, so a process that never calls a model never loads it.
import type OpenAI from "openai";
import type { Fetch, ProviderEndpoint, ProviderGet, ProviderPost } from "./provider-post.js";
import { refusalsKept, sdkAnswer } from "./sdk-calls.js";

/** A request option the SDK's calls take: the caller's signal. */
type CallOptions = { signal: AbortSignal };
/** An SDK call, given as the raw answer. */
type Call = (client: OpenAI, body: never, options: CallOptions) => { asResponse(): Promise<Response> };

/** The endpoints the runner and the memory service POST to, each by its SDK method. */
const POSTS: Record<string, Call> = {
  "/chat/completions": (c, body: OpenAI.Chat.ChatCompletionCreateParams, o) => c.chat.completions.create(body, o),
  "/responses": (c, body: OpenAI.Responses.ResponseCreateParams, o) => c.responses.create(body, o),
  "/embeddings": (c, body: OpenAI.EmbeddingCreateParams, o) => c.embeddings.create(body, o),
};

/**
 * POSTs to `endpoint` through the SDK. Contract: providerPoster's (provider-post.ts): the answer
 * when its status is 2xx, its body unread; a ProviderRefusal for any other; what the fetch threw
 * when there was no answer.
 */
export function openaiPoster(endpoint: ProviderEndpoint, fetch: Fetch): ProviderPost {
  const client = lazyClient(endpoint, fetch);
  return async (path, body, signal) => {
    const c = await client();
    const call = POSTS[path];
    const options = { signal };
    const pending = call
      ? call(c, body as never, options)
      : c.post(path, { body: body as Record<string, unknown>, ...options });
    return sdkAnswer(() => pending.asResponse());
  };
}

/** GETs from `endpoint` through the SDK (models.retrieve for /models/{id}). Contract: as openaiPoster's. */
export function openaiGetter(endpoint: ProviderEndpoint, fetch: Fetch): ProviderGet {
  const client = lazyClient(endpoint, fetch);
  return async (path, signal) => {
    const c = await client();
    const model = /^\/models\/([^/]+)$/.exec(path)?.[1];
    const pending = model ? c.models.retrieve(decodeURIComponent(model), { signal }) : c.get(path, { signal });
    return sdkAnswer(() => pending.asResponse());
  };
}

/** The SDK's client for `endpoint`, made at the first call. */
function lazyClient(endpoint: ProviderEndpoint, fetch: Fetch): () => Promise<OpenAI> {
  let made: Promise<OpenAI> | undefined;
  return () => {
    made ??= import("openai").then(
      ({ default: OpenAISdk }) =>
        new OpenAISdk({
          baseURL: endpoint.baseUrl,
          // A local server without keys: the SDK wants a key, and the header it makes is removed.
          apiKey: endpoint.apiKey || "unused",
          organization: null,
          project: null,
          defaultHeaders: { ...endpoint.headers, ...(endpoint.apiKey ? {} : { authorization: null }) },
          maxRetries: 0,
          fetch: refusalsKept(fetch) as never,
          logLevel: "off",
        }),
    );
    return made;
  };
}
