// What each model accepts, in one table: the request a provider client sends is fitted to it, so
// an agent.json that asks for a temperature or a reasoning effort works on every model of its
// fallback chain, each getting only what it takes. To support a new model family, add a row.
//
// Sources: OpenAI's API reference for chat completions (platform.openai.com/docs/api-reference/chat/create:
// "max_tokens ... is not compatible with o-series models", use max_completion_tokens) and its
// reasoning guide (platform.openai.com/docs/guides/reasoning: reasoning_effort; sampling
// parameters such as temperature are refused with `unsupported_parameter`/`unsupported_value`).
import type { ProviderKind } from "./providers.js";

export type ReasoningEffort = "minimal" | "low" | "medium" | "high";

export interface RequestRules {
  /** The request field that caps the reply's tokens. */
  maxTokensField: "max_tokens" | "max_completion_tokens";
  /** Whether temperature may be sent (reasoning models take only their default). */
  sampling: boolean;
  /** The reasoning_effort values the model takes; empty: never sent. */
  reasoningEfforts: readonly ReasoningEffort[];
  /** Whether response_format {"type": "json_object"} is taken (learning asks for JSON with it). */
  jsonObject: boolean;
}

interface Row {
  kinds: readonly ProviderKind[];
  /** Matched against the model name as the provider knows it (no `provider/` prefix). */
  model: RegExp;
  rules: RequestRules;
}

const OPENAI: readonly ProviderKind[] = ["openai", "openai-responses"];

/** First matching row wins; the last row of each kind is its default. */
const RULES: readonly Row[] = [
  // The gpt-5 family reasons (gpt-5-chat-latest is the exception: a chat model without reasoning).
  {
    kinds: OPENAI,
    model: /^gpt-5(?!-chat)/,
    rules: {
      maxTokensField: "max_completion_tokens",
      sampling: false,
      reasoningEfforts: ["minimal", "low", "medium", "high"],
      jsonObject: true,
    },
  },
  // The o series: o1, o3, o3-mini, o4-mini, ...
  {
    kinds: OPENAI,
    model: /^o\d/,
    rules: {
      maxTokensField: "max_completion_tokens",
      sampling: false,
      reasoningEfforts: ["low", "medium", "high"],
      jsonObject: true,
    },
  },
  // Every other OpenAI model: max_tokens is deprecated there, max_completion_tokens is taken by all.
  {
    kinds: OPENAI,
    model: /./,
    rules: { maxTokensField: "max_completion_tokens", sampling: true, reasoningEfforts: [], jsonObject: true },
  },
  // Ollama, vLLM, LiteLLM and their kin: the older field is the one they all read; JSON mode is
  // not asked for, as not every server has it (learning parses the reply either way).
  {
    kinds: ["openai-compatible"],
    model: /./,
    rules: { maxTokensField: "max_tokens", sampling: true, reasoningEfforts: [], jsonObject: false },
  },
];

/**
 * Anthropic's models: max_tokens is required, the Messages API (version 2026-10-21) takes no
 * sampling parameters, and an effort is output_config.effort with extended thinking (anthropic-model.ts).
 */
const ANTHROPIC: Row = {
  kinds: ["anthropic"],
  model: /./,
  rules: {
    maxTokensField: "max_tokens",
    sampling: false,
    reasoningEfforts: ["low", "medium", "high"],
    jsonObject: false,
  },
};

const FALLBACK: RequestRules = {
  maxTokensField: "max_tokens",
  sampling: true,
  reasoningEfforts: [],
  jsonObject: false,
};

/** The rules for `model` served by a provider of `kind`. */
export function rulesFor(kind: ProviderKind, model: string): RequestRules {
  return [...RULES, ANTHROPIC].find((r) => r.kinds.includes(kind) && r.model.test(model))?.rules ?? FALLBACK;
}

/**
 * Models that take images (OpenAI's vision guide, platform.openai.com/docs/guides/images-vision;
 * every current Claude model, docs.anthropic.com/en/docs/build-with-claude/vision), and those the
 * providers file declares (`visionModels`: an OpenAI-compatible server's models are unknown here).
 * Others get a message's text alone, which names its attachments.
 */
const VISION: Partial<Record<ProviderKind, RegExp>> = {
  openai: /^(gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-4-turbo|gpt-5|o1(?!-mini|-preview)|o3(?!-mini)|o4)/,
  "openai-responses": /^(gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-4-turbo|gpt-5|o1(?!-mini|-preview)|o3(?!-mini)|o4)/,
  anthropic: /./,
};

export function takesImages(kind: ProviderKind, model: string, declared: readonly string[] = []): boolean {
  if (VISION[kind]?.test(model)) return true;
  return declared.some((d) => (d.endsWith("*") ? model.startsWith(d.slice(0, -1)) : model === d));
}
