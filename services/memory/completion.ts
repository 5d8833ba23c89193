// One question, one answer: how learning asks its model, by the kind of provider that serves it.
// OpenAI's kinds (Responses included: OpenAI serves Chat Completions at the same root) and
// compatible servers through Chat Completions; Anthropic through its Messages API.
import type Anthropic from "@anthropic-ai/sdk";
import type OpenAI from "openai";
import { lazyModule } from "../shared/lazy-module.js";
import { rulesFor } from "../shared/model-rules.js";
import type { ProviderSpec } from "../shared/providers.js";

/** The model's answer to `user` under `system`. May reject (the provider's errors). */
export type Complete = (system: string, user: string) => Promise<string>;

// Learning with the built-in rules needs neither SDK: each is loaded when a provider of its kind is.
const anthropic = lazyModule<{ Anthropic: typeof Anthropic }>("@anthropic-ai/sdk");
const openai = lazyModule<{ OpenAI: typeof OpenAI }>("openai");

export function completionFor(provider: Pick<ProviderSpec, "kind" | "baseUrl" | "apiKey">, model: string): Complete {
  const apiKey = provider.apiKey || "unused";
  if (provider.kind === "anthropic") {
    const client = new (anthropic().Anthropic)({
      baseURL: provider.baseUrl.replace(/\/v1\/?$/, ""),
      apiKey,
      maxRetries: 1,
      timeout: 60_000,
    });
    return async (system, user) => {
      const res = await client.messages.create({
        model,
        max_tokens: 1024,
        system,
        messages: [{ role: "user", content: user }],
      });
      return res.content.map((b) => (b.type === "text" ? b.text : "")).join("");
    };
  }
  const client = new (openai().OpenAI)({ baseURL: provider.baseUrl, apiKey, maxRetries: 1, timeout: 60_000 });
  const rules = rulesFor(provider.kind, model);
  return async (system, user) => {
    const res = await client.chat.completions.create({
      model,
      messages: [
        { role: "system", content: system },
        { role: "user", content: user },
      ],
      // Deterministic where the model lets us choose; JSON asked for where the provider takes it.
      ...(rules.sampling ? { temperature: 0 } : {}),
      ...(rules.jsonObject ? { response_format: { type: "json_object" as const } } : {}),
    });
    return res.choices[0]?.message?.content ?? "";
  };
}
