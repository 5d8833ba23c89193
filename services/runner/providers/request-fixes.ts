// What a provider refused by name, remembered per model, so that the next request is fitted to it.
// model-rules.ts knows model families by name; an OpenAI-style provider serving a model under
// another name (an Azure deployment, a gateway's alias) tells what it does not take instead:
// `400 {"error": {"code": "unsupported_parameter", "param": "max_tokens", "message": "... Use
// 'max_completion_tokens' instead."}}`, or `unsupported_value` for a temperature (OpenAI's error
// codes, platform.openai.com/docs/guides/error-codes, and its reasoning guide). The refused field
// is dropped, or renamed to the replacement the message names, the request is sent once more, and
// the fix is kept for this provider and model and logged once.
import type { Logger } from "../../shared/process/log.js";
import { ProviderRefusal, type ProviderPost } from "../../shared/models/provider-post.js";

const LEARNABLE = new Set(["unsupported_parameter", "unsupported_value"]);
/** Models remembered per provider; more are forgotten oldest first (names come from configuration). */
const MAX_MODELS = 1000;
/** Fixes learned in one call at most: each costs a request. */
export const MAX_FIXES_PER_CALL = 3;

export class RequestFixes {
  /** model -> refused field -> the field that replaces it, or null: not sent. */
  private readonly byModel = new Map<string, Map<string, string | null>>();

  constructor(
    private readonly provider: string,
    private readonly logger?: Logger,
  ) {}

  /** `body` with this model's learned fixes applied (the same object when there are none). */
  apply<T extends object>(model: string, body: T): T {
    const fixes = this.byModel.get(model);
    if (!fixes) return body;
    const out = { ...body } as Record<string, unknown>;
    for (const [field, replacement] of fixes) {
      if (!(field in out)) continue;
      const value = out[field];
      delete out[field];
      if (replacement !== null && !(replacement in out)) out[replacement] = value;
    }
    return out as unknown as T;
  }

  /**
   * Learns from `refusal` of `body` sent for `model`. True when it named a top-level field of the
   * body not learned before: the caller may send the request once more, fitted by apply().
   */
  learn(model: string, refusal: ProviderRefusal, body: object): boolean {
    const field = refusal.param;
    if (refusal.status !== 400 || !LEARNABLE.has(refusal.code ?? "") || !field || !(field in body)) return false;
    const fixes = this.byModel.get(model) ?? new Map<string, string | null>();
    if (fixes.has(field)) return false;
    const named = /Use '([a-z_]{1,64})' instead/.exec(refusal.message)?.[1];
    const replacement = named && named !== field && !(named in body) ? named : null;
    fixes.set(field, replacement);
    this.byModel.delete(model);
    this.byModel.set(model, fixes);
    if (this.byModel.size > MAX_MODELS) this.byModel.delete(this.byModel.keys().next().value!);
    this.logger?.warn(
      `provider ${this.provider} refused ${field} for ${model}: ${replacement ? `sending ${replacement} instead` : "no longer sent"} to this model`,
      { provider: this.provider, model, field, replacement: replacement ?? undefined, code: refusal.code },
    );
    return true;
  }
}

/**
 * POSTs `body` fitted to what `model` is known to refuse; a refusal that teaches a fix sends it
 * once more, fitted again (at most MAX_FIXES_PER_CALL times). Contract: providerPoster's.
 */
export async function postFitted(
  post: ProviderPost,
  fixes: RequestFixes | undefined,
  path: string,
  model: string,
  body: object,
  signal: AbortSignal,
): Promise<Response> {
  for (let learned = 0; ; learned++) {
    const sent = fixes ? fixes.apply(model, body) : body;
    try {
      return await post(path, sent, signal);
    } catch (err) {
      if (
        !fixes ||
        learned >= MAX_FIXES_PER_CALL ||
        !(err instanceof ProviderRefusal) ||
        !fixes.learn(model, err, sent)
      )
        throw err;
    }
  }
}
