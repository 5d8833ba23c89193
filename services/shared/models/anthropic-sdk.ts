// Anthropic's Messages API through `@anthropic-ai/sdk`: it builds each request (messages.create,
// models.retrieve), sets the key and the API version, and follows the API as it changes. As with
// OpenAI's (openai-sdk.ts): it is given the runner's pooled fetch, never retries (the loop
// decides), its refusals are worded by errorOf (sdk-calls.ts), and a streamed reply is taken raw
// (`asResponse`) for the runner's SSE decoder. Its own OpenTelemetry spans are off: the runner
// makes one gen_ai span per model call for every provider (tracing.md), and two would count each
// call twice. Its log is off: a warning of its own in plain text does not belong among JSON logs;
// the runner warns of a model's end of life itself (model-lifecycle.ts). Loaded at the first call.
import type Anthropic from "@anthropic-ai/sdk";
import {
  ANTHROPIC_VERSION,
  type Fetch,
  type ProviderEndpoint,
  type ProviderGet,
  type ProviderPost,
} from "./provider-post.js";
import { refusalsKept, sdkAnswer } from "./sdk-calls.js";

/** POSTs to `endpoint` (/v1/messages by messages.create). Contract: providerPoster's (provider-post.ts). */
export function anthropicPoster(endpoint: ProviderEndpoint, fetch: Fetch): ProviderPost {
  const client = lazyClient(endpoint, fetch);
  return async (path, body, signal) => {
    const c = await client();
    const pending =
      path === "/v1/messages"
        ? c.messages.create(body as Anthropic.MessageCreateParams, { signal })
        : c.post(path, { body: body as Record<string, unknown>, signal });
    return sdkAnswer(() => pending.asResponse());
  };
}

/** GETs from `endpoint` (models.retrieve for /v1/models/{id}). Contract: as anthropicPoster's. */
export function anthropicGetter(endpoint: ProviderEndpoint, fetch: Fetch): ProviderGet {
  const client = lazyClient(endpoint, fetch);
  return async (path, signal) => {
    const c = await client();
    const model = /^\/v1\/models\/([^/]+)$/.exec(path)?.[1];
    const pending = model ? c.models.retrieve(decodeURIComponent(model), {}, { signal }) : c.get(path, { signal });
    return sdkAnswer(() => pending.asResponse());
  };
}

function lazyClient(endpoint: ProviderEndpoint, fetch: Fetch): () => Promise<Anthropic> {
  let made: Promise<Anthropic> | undefined;
  return () => {
    made ??= import("@anthropic-ai/sdk").then(
      ({ default: AnthropicSdk }) =>
        new AnthropicSdk({
          baseURL: endpoint.baseUrl.replace(/\/+$/, "").replace(/\/v1$/, ""),
          apiKey: endpoint.apiKey || "unused",
          defaultHeaders: {
            ...endpoint.headers,
            "anthropic-version": ANTHROPIC_VERSION,
            ...(endpoint.apiKey ? {} : { "x-api-key": null }),
          },
          maxRetries: 0,
          fetch: refusalsKept(fetch) as never,
          logLevel: "off",
          openTelemetry: false,
        } as ConstructorParameters<typeof AnthropicSdk>[0]),
    );
    return made;
  };
}
