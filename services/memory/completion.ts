// One question, one answer: how learning asks its model, by the kind of provider that serves it.
// OpenAI's kinds (Responses included: OpenAI serves Chat Completions at the same root) and
// compatible servers through Chat Completions, by the openai SDK; Anthropic through its Messages API.
import { askProvider, type ModelLifecycle } from "../shared/models/model-lifecycle.js";
import { rulesFor } from "../shared/models/model-rules.js";
import { openaiGetter, openaiPoster } from "../shared/models/openai-sdk.js";
import { anthropicEndpoint, postForJson, providerGetter, providerPoster } from "../shared/models/provider-post.js";
import type { ProviderSpec } from "../shared/models/providers.js";

/** The model's answer to `user` under `system`. May reject (the provider's errors). */
export type Complete = (system: string, user: string) => Promise<string>;

/** One try of a learning call; a retryable failure gets one more (postForJson). */
const COMPLETE_TIMEOUT_MS = 60_000;
/** The longest answer read: learning asks for a few facts, and a whole reply of 128K tokens is about 0.5 MB. */
const MAX_ANSWER_BYTES = 16 * 1024 * 1024;

export function completionFor(
  provider: Pick<ProviderSpec, "kind" | "baseUrl" | "apiKey" | "headers">,
  model: string,
): Complete {
  if (provider.kind === "anthropic") {
    const post = providerPoster(anthropicEndpoint(provider), fetch);
    return async (system, user) => {
      const answer = (await postForJson(
        post,
        "/v1/messages",
        { model, max_tokens: 1024, system, messages: [{ role: "user", content: user }] },
        COMPLETE_TIMEOUT_MS,
        MAX_ANSWER_BYTES,
      )) as { content?: { type?: string; text?: string }[] };
      return (answer.content ?? []).map((b) => (b.type === "text" ? (b.text ?? "") : "")).join("");
    };
  }
  const post = openaiPoster(provider, fetch);
  const rules = rulesFor(provider.kind, model);
  return async (system, user) => {
    const answer = await postForJson(
      post,
      "/chat/completions",
      {
        model,
        messages: [
          { role: "system", content: system },
          { role: "user", content: user },
        ],
        // Deterministic where the model lets us choose; JSON asked for where the provider takes it.
        ...(rules.sampling ? { temperature: 0 } : {}),
        ...(rules.jsonObject ? { response_format: { type: "json_object" } } : {}),
      },
      COMPLETE_TIMEOUT_MS,
      MAX_ANSWER_BYTES,
    );
    const choices = (answer as { choices?: { message?: { content?: unknown } }[] }).choices;
    const content = Array.isArray(choices) ? choices[0]?.message?.content : undefined;
    return typeof content === "string" ? content : "";
  };
}

/**
 * What the provider says of the learning model, asked as the runner asks of its models
 * (shared/models/model-lifecycle.ts). Contract: never throws.
 */
export function lifecycleFor(
  provider: Pick<ProviderSpec, "kind" | "baseUrl" | "apiKey" | "headers">,
  model: string,
): (signal: AbortSignal) => Promise<ModelLifecycle> {
  const get =
    provider.kind === "anthropic" ? providerGetter(anthropicEndpoint(provider), fetch) : openaiGetter(provider, fetch);
  return (signal) => askProvider(provider.kind, get, model, signal);
}
