// One question, one answer: how learning asks its model, by the kind of provider that serves it.
// OpenAI's kinds (Responses included: OpenAI serves Chat Completions at the same root) and
// compatible servers through Chat Completions; Anthropic through its Messages API.
import type Anthropic from "@anthropic-ai/sdk";
import { lazyModule } from "../shared/lazy-module.js";
import { rulesFor } from "../shared/model-rules.js";
import { jsonUpTo } from "../shared/bounded-body.js";
import { postForJson, providerPoster } from "../shared/provider-post.js";
import type { ProviderSpec } from "../shared/providers.js";

/** The model's answer to `user` under `system`. May reject (the provider's errors). */
export type Complete = (system: string, user: string) => Promise<string>;

// Anthropic's SDK is loaded when an Anthropic provider is; OpenAI's kinds need no SDK
// (shared/provider-post.ts says why).
const anthropic = lazyModule<{ Anthropic: typeof Anthropic }>("@anthropic-ai/sdk");
/** One try of a learning call; a retryable failure gets one more (postForJson). */
const COMPLETE_TIMEOUT_MS = 60_000;
/** The longest answer read: learning asks for a few facts, and a whole reply of 128K tokens is about 0.5 MB. */
const MAX_ANSWER_BYTES = 16 * 1024 * 1024;

export function completionFor(
  provider: Pick<ProviderSpec, "kind" | "baseUrl" | "apiKey" | "headers">,
  model: string,
): Complete {
  if (provider.kind === "anthropic") {
    const client = new (anthropic().Anthropic)({
      baseURL: provider.baseUrl.replace(/\/v1\/?$/, ""),
      apiKey: provider.apiKey || "unused",
      maxRetries: 1,
      timeout: 60_000,
    });
    return async (system, user) => {
      // The SDK sends (its retries, its errors); the answer is read here, to its bound.
      const response = await client.messages
        .create({ model, max_tokens: 1024, system, messages: [{ role: "user", content: user }] })
        .asResponse();
      const res = (await jsonUpTo(response, MAX_ANSWER_BYTES)) as Anthropic.Message;
      return (res.content ?? []).map((b) => (b.type === "text" ? b.text : "")).join("");
    };
  }
  const post = providerPoster(provider, fetch);
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
