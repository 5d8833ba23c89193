// What each kind of model provider is, for the services that call one (the runner streams through
// runner/providers/provider-models.ts, whose CLIENTS add each kind's streaming client): its SDK's
// calls, the one-question form learning asks in, whether it serves embeddings, and how it is asked
// about a model's life. The kinds' model facts (request rules, vision, end-of-life days) are
// tables by kind in model-rules.ts. Adding a kind: docs/extending.md.
import { anthropicGetter, anthropicPoster } from "./anthropic-sdk.js";
import { askAnthropic, askOpenAi, type ModelLifecycle } from "./model-lifecycle.js";
import { rulesFor } from "./model-rules.js";
import { openaiGetter, openaiPoster } from "./openai-sdk.js";
import type { Fetch, ProviderEndpoint, ProviderGet, ProviderPost } from "./provider-post.js";
import type { ProviderKind } from "./providers.js";

/** One question with one answer (learning's), in a kind's API. */
export interface Question {
  path: string;
  body(model: string, system: string, user: string): object;
  /** The answer's text from the provider's JSON; "" when it has none. */
  answer(doc: unknown): string;
}

export interface ProviderProtocol {
  /** Its requests through its SDK over `fetch` (openai-sdk.ts, anthropic-sdk.ts). */
  calls(endpoint: ProviderEndpoint, fetch: Fetch): { post: ProviderPost; get: ProviderGet };
  /** What the provider says of `model`, asked through `get`. Contract: never throws. */
  ask(get: ProviderGet, model: string, signal: AbortSignal): Promise<ModelLifecycle>;
  question: Question;
  /** Serves POST /embeddings (OpenAI's form). */
  embeddings: boolean;
}

const openaiCalls = (endpoint: ProviderEndpoint, fetch: Fetch) => ({
  post: openaiPoster(endpoint, fetch),
  get: openaiGetter(endpoint, fetch),
});

/** Chat Completions, as OpenAI and every compatible server take it (Responses providers serve it too). */
const chatQuestion = (kind: ProviderKind): Question => ({
  path: "/chat/completions",
  body(model, system, user) {
    const rules = rulesFor(kind, model);
    return {
      model,
      messages: [
        { role: "system", content: system },
        { role: "user", content: user },
      ],
      // Deterministic where the model lets us choose; JSON asked for where the provider takes it.
      ...(rules.sampling ? { temperature: 0 } : {}),
      ...(rules.jsonObject ? { response_format: { type: "json_object" } } : {}),
    };
  },
  answer(doc) {
    const choices = (doc as { choices?: { message?: { content?: unknown } }[] } | null)?.choices;
    const content = Array.isArray(choices) ? choices[0]?.message?.content : undefined;
    return typeof content === "string" ? content : "";
  },
});

const openai = (kind: ProviderKind, ask: ProviderProtocol["ask"]): ProviderProtocol => ({
  calls: openaiCalls,
  ask,
  question: chatQuestion(kind),
  embeddings: true,
});

export const PROVIDER_KINDS: Readonly<Record<ProviderKind, ProviderProtocol>> = {
  openai: openai("openai", askOpenAi),
  "openai-responses": openai("openai-responses", askOpenAi),
  // A compatible server is not asked about its models: few answer, and none says until when.
  "openai-compatible": openai("openai-compatible", async () => ({})),
  anthropic: {
    calls: (endpoint, fetch) => ({ post: anthropicPoster(endpoint, fetch), get: anthropicGetter(endpoint, fetch) }),
    ask: askAnthropic,
    question: {
      path: "/v1/messages",
      body: (model, system, user) => ({ model, max_tokens: 1024, system, messages: [{ role: "user", content: user }] }),
      answer: (doc) =>
        ((doc as { content?: { type?: string; text?: string }[] } | null)?.content ?? [])
          .map((b) => (b.type === "text" ? (b.text ?? "") : ""))
          .join(""),
    },
    embeddings: false,
  },
};
