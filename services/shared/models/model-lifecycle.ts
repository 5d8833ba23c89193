// Is a model still served, and until when? Each provider says so its own way, and the runner (a
// warning at a model's first call), the memory service (at learning's first call) and `troupe
// doctor` (before any run) ask the same questions:
// - OpenAI answers GET /models/{model} with the Model object, whose `shutdown_date` is the day it
//   stops serving the model (YYYY-MM-DD) or null when none is announced, and with 404
//   model_not_found for a model it does not serve (developers.openai.com/api/reference/resources/
//   models/methods/retrieve; its deprecations page, developers.openai.com/api/docs/deprecations,
//   says to watch shutdowns through that field). So no table of OpenAI's days is kept here.
// - Anthropic answers GET /v1/models/{model_id} with a ModelInfo that has no retirement day
//   (platform.claude.com/docs/en/api/models/retrieve), and 404 not_found_error for a model it does
//   not serve; its days come from its deprecation table (model-rules.ts).
// - An OpenAI-compatible server is not asked: a proxy (LiteLLM) maps a name to a model Troupe
//   cannot see, and servers differ in whether they have the route at all.
import { discardBody, jsonUpTo } from "../net/bounded-body.js";
import { endOfLife } from "./model-rules.js";
import { type ProviderGet, ProviderRefusal } from "./provider-post.js";

export interface ModelLifecycle {
  /** false: the provider answered 404 for it; undefined: not asked, or no answer. */
  served?: boolean;
  /** The day (YYYY-MM-DD) its provider stops serving it, when one is announced. */
  endOfLife?: string;
}

/** A Model object is a few hundred bytes; more is not a model's description. */
const MAX_DESCRIPTION_BYTES = 64 * 1024;
const DAY = /^\d{4}-\d{2}-\d{2}$/;

/** What a failed GET says of the model: a 404 that it is not served, anything else nothing. */
const unanswered = (err: unknown): ModelLifecycle =>
  err instanceof ProviderRefusal && err.status === 404 ? { served: false } : {};

/** OpenAI's Model object for `model`. Contract: never throws. */
export async function askOpenAi(get: ProviderGet, model: string, signal: AbortSignal): Promise<ModelLifecycle> {
  try {
    const response = await get(`/models/${encodeURIComponent(model)}`, signal);
    const doc = (await jsonUpTo(response, MAX_DESCRIPTION_BYTES)) as { shutdown_date?: unknown } | null;
    const day = doc?.shutdown_date;
    return typeof day === "string" && DAY.test(day) ? { served: true, endOfLife: day } : { served: true };
  } catch (err) {
    return unanswered(err);
  }
}

/** Anthropic's ModelInfo for `model`, and its day from the deprecation table. Contract: never throws. */
export async function askAnthropic(get: ProviderGet, model: string, signal: AbortSignal): Promise<ModelLifecycle> {
  const day = endOfLife("anthropic", model);
  const known = day ? { endOfLife: day } : {};
  try {
    await discardBody(await get(`/v1/models/${encodeURIComponent(model)}`, signal));
    return { served: true, ...known };
  } catch (err) {
    return { ...unanswered(err), ...known };
  }
}

/** How long a model's first call waits at most for its provider to say until when it serves it. */
export const LIFECYCLE_TIMEOUT_MS = 10_000;

/** The warning for a model with an announced end of life: before the day, and after it. */
export function endOfLifeWarning(model: string, day: string, today = new Date().toISOString().slice(0, 10)): string {
  const when = day < today ? "was retired on" : "reaches its end of life on";
  return `model ${model} ${when} ${day}; requests to it fail from then on: move to a later model`;
}
