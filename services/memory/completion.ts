// One question, one answer: how learning asks its model, in the form of the kind of provider that
// serves it (shared/models/provider-kinds.ts: Chat Completions for OpenAI's kinds, the Messages
// API for Anthropic's).
import type { ModelLifecycle } from "../shared/models/model-lifecycle.js";
import { PROVIDER_KINDS } from "../shared/models/provider-kinds.js";
import { postForJson } from "../shared/models/provider-post.js";
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
  const { calls, question } = PROVIDER_KINDS[provider.kind];
  const { post } = calls(provider, fetch);
  return async (system, user) =>
    question.answer(
      await postForJson(post, question.path, question.body(model, system, user), COMPLETE_TIMEOUT_MS, MAX_ANSWER_BYTES),
    );
}

/**
 * What the provider says of the learning model, asked as the runner asks of its models
 * (shared/models/model-lifecycle.ts). Contract: never throws.
 */
export function lifecycleFor(
  provider: Pick<ProviderSpec, "kind" | "baseUrl" | "apiKey" | "headers">,
  model: string,
): (signal: AbortSignal) => Promise<ModelLifecycle> {
  const { calls, ask } = PROVIDER_KINDS[provider.kind];
  const { get } = calls(provider, fetch);
  return (signal) => ask(get, model, signal);
}
