// What each model accepts, in one table: the request a provider client sends is fitted to it, so
// an agent.json that asks for a temperature or a reasoning effort works on every model of its
// fallback chain, each getting only what it takes. To support a new model family, add a row.
//
// Sources: OpenAI's API reference for chat completions (platform.openai.com/docs/api-reference/chat/create:
// "max_tokens ... is not compatible with o-series models", use max_completion_tokens) and its
// reasoning guide (platform.openai.com/docs/guides/reasoning: reasoning_effort; sampling
// parameters such as temperature are refused with `unsupported_parameter`/`unsupported_value`),
// and its ReasoningEffort type (platform.openai.com/docs/api-reference/chat/create#reasoning_effort:
// gpt-5.1 and later take none, low, medium and high, and refuse minimal; gpt-5-pro takes high
// only).
import type { ProviderKind } from "./providers.js";

export type ReasoningEffort = "minimal" | "low" | "medium" | "high";
/** The efforts Claude models take (as output_config.effort, or as a thinking budget). */
export type AnthropicEffort = Exclude<ReasoningEffort, "minimal">;

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

/** A Claude model's rules: its efforts, and how an effort asks it to think (anthropic-model.ts). */
export interface AnthropicRules extends RequestRules {
  reasoningEfforts: readonly AnthropicEffort[];
  thinking: AnthropicThinking;
}

/**
 * Adaptive thinking (`thinking: {type: "adaptive"}`, the effort as `output_config.effort`) is the
 * only thinking later Claude models take; a budget (`{type: "enabled", budget_tokens}`) is the
 * only one earlier models take, and of those only some take an effort beside it.
 */
export type AnthropicThinking = { mode: "adaptive" } | { mode: "budget"; effort: boolean };

interface Row {
  kinds: readonly ProviderKind[];
  /** Matched against the model name as the provider knows it (no `provider/` prefix). */
  model: RegExp;
  rules: RequestRules;
}

const OPENAI: readonly ProviderKind[] = ["openai", "openai-responses"];

/** An OpenAI model that reasons at `efforts` (none: does not reason, and takes a temperature). */
const openAi = (efforts: readonly ReasoningEffort[]): RequestRules => ({
  maxTokensField: "max_completion_tokens",
  sampling: efforts.length === 0,
  reasoningEfforts: efforts,
  jsonObject: true,
});

/** First matching row wins; the last row of each kind is its default. */
const RULES: readonly Row[] = [
  // gpt-5-chat-latest, gpt-5.1-chat-latest, ...: chat models without reasoning.
  { kinds: OPENAI, model: /^gpt-5(\.\d+)?-chat/, rules: openAi([]) },
  // gpt-5-pro reasons at high, and takes no other effort.
  { kinds: OPENAI, model: /^gpt-5(\.\d+)?-pro/, rules: openAi(["high"]) },
  // gpt-5.1 and later: no minimal (their least is none, their default).
  { kinds: OPENAI, model: /^gpt-5\.\d/, rules: openAi(["low", "medium", "high"]) },
  // The gpt-5 family reasons.
  { kinds: OPENAI, model: /^gpt-5/, rules: openAi(["minimal", "low", "medium", "high"]) },
  // The o series: o1, o3, o3-mini, o4-mini, ...
  { kinds: OPENAI, model: /^o\d/, rules: openAi(["low", "medium", "high"]) },
  // Every other OpenAI model: max_tokens is deprecated there, max_completion_tokens is taken by all.
  { kinds: OPENAI, model: /./, rules: openAi([]) },
  // Ollama, vLLM, LiteLLM and their kin: the older field is the one they all read; JSON mode is
  // not asked for, as not every server has it (learning parses the reply either way).
  {
    kinds: ["openai-compatible"],
    model: /./,
    rules: { maxTokensField: "max_tokens", sampling: true, reasoningEfforts: [], jsonObject: false },
  },
];

/**
 * Anthropic's models: max_tokens is required, and the Messages API (version 2026-10-21) takes no
 * sampling parameters. How thinking is asked for depends on the model (Anthropic's adaptive
 * thinking guide, platform.claude.com/docs/en/build-with-claude/adaptive-thinking, and the same
 * table in Amazon Bedrock's user guide, docs.aws.amazon.com/bedrock/latest/userguide/
 * claude-messages-adaptive-thinking.html): Claude 4.6 and later take adaptive thinking, and from
 * Opus 4.7 on refuse a budget with HTTP 400; Sonnet 4.5, Opus 4.5, Haiku 4.5 and earlier take a
 * budget only. The effort parameter came with Opus 4.5; Sonnet 4.5 and Haiku 4.5 do not take it.
 * A Claude model this table does not name is taken to be a later one: adaptive.
 */
const anthropicRules = (thinking: AnthropicThinking): AnthropicRules => ({
  maxTokensField: "max_tokens",
  sampling: false,
  reasoningEfforts: ["low", "medium", "high"],
  jsonObject: false,
  thinking,
});
const ANTHROPIC: readonly { model: RegExp; rules: AnthropicRules }[] = [
  { model: /^claude-opus-4-5(-\d{8})?$/, rules: anthropicRules({ mode: "budget", effort: true }) },
  {
    // Claude 3.x, Sonnet 4 and 4.5, Opus 4 and 4.1, Haiku 4.5 (with or without a date).
    model: /^claude-(3-|sonnet-4(-[05])?(-\d{8})?$|opus-4(-[01])?(-\d{8})?$|haiku-4-5)/,
    rules: anthropicRules({ mode: "budget", effort: false }),
  },
];
const LATER_CLAUDE = anthropicRules({ mode: "adaptive" });

const FALLBACK: RequestRules = {
  maxTokensField: "max_tokens",
  sampling: true,
  reasoningEfforts: [],
  jsonObject: false,
};

/**
 * The effort to send for an agent's `effort` under `rules`: as asked where the model takes it;
 * minimal as low where the model has no minimal (the nearest level that still reasons); else
 * none, and the model reasons at its default.
 */
export function effortFor<E extends ReasoningEffort>(
  rules: { reasoningEfforts: readonly E[] },
  effort: ReasoningEffort | undefined,
): E | undefined {
  if (!effort) return undefined;
  const wanted = effort === "minimal" && !rules.reasoningEfforts.some((e) => e === "minimal") ? "low" : effort;
  return rules.reasoningEfforts.find((e) => e === wanted);
}

/**
 * Claude models and the day each stops being served (ISO dates): Anthropic's deprecation table as
 * @anthropic-ai/sdk 1.13 carries it (internal/data/deprecated-models), whose page is
 * platform.claude.com/docs/en/about-claude/model-deprecations. Requests after that day fail; the
 * runner and `troupe doctor` warn before (model-lifecycle.ts). Dates move: keep this in step with the page.
 */
const CLAUDE_END_OF_LIFE: Readonly<Record<string, string>> = {
  "claude-mythos-preview": "2026-06-30",
  "claude-sonnet-4-5": "2026-11-30",
  "claude-sonnet-4-5-20250929": "2026-11-30",
  "claude-opus-4-5": "2027-01-22",
  "claude-opus-4-5-20251101": "2027-01-22",
};

/** Announced end-of-life days by kind (OpenAI's say theirs when asked, model-lifecycle.ts). */
const END_OF_LIFE: Partial<Record<ProviderKind, Readonly<Record<string, string>>>> = { anthropic: CLAUDE_END_OF_LIFE };

/** The day `model` of a provider of `kind` stops being served, if one is announced. */
export function endOfLife(kind: ProviderKind, model: string): string | undefined {
  return END_OF_LIFE[kind]?.[model];
}

/** The rules for Claude model `model`. */
export function anthropicRulesFor(model: string): AnthropicRules {
  return ANTHROPIC.find((r) => r.model.test(model))?.rules ?? LATER_CLAUDE;
}

/**
 * OpenAI's own model families, known by name behind any OpenAI-style base URL (Azure OpenAI, an
 * enterprise gateway, LiteLLM, a proxy): the request rules go by the model, not by the host. A
 * vendor prefix (`openai/gpt-5-mini`, as gateways name models) is read past. A model whose name
 * says nothing (an Azure deployment named by its operator) is fitted by what its provider refuses
 * (runner/providers/request-fixes.ts).
 */
const OPENAI_FAMILY = /^(gpt-5|o\d)/;

/** The rules of an OpenAI-style kind's `model`; a compatible server's OpenAI model goes by OpenAI's. */
function openaiRulesFor(kind: ProviderKind, model: string): RequestRules {
  const bare = model.slice(model.lastIndexOf("/") + 1);
  const asKind = OPENAI_FAMILY.test(bare) && !OPENAI.includes(kind) ? "openai" : kind;
  return RULES.find((r) => r.kinds.includes(asKind) && r.model.test(bare))?.rules ?? FALLBACK;
}

/** Each kind's rules, by model. */
const RULES_BY_KIND: Record<ProviderKind, (model: string) => RequestRules> = {
  openai: (m) => openaiRulesFor("openai", m),
  "openai-responses": (m) => openaiRulesFor("openai-responses", m),
  "openai-compatible": (m) => openaiRulesFor("openai-compatible", m),
  anthropic: anthropicRulesFor,
};

/** The rules for `model` served by a provider of `kind`. */
export function rulesFor(kind: ProviderKind, model: string): RequestRules {
  return RULES_BY_KIND[kind](model);
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
