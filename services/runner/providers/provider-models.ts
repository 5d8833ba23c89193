// The one ModelClient the loop sees over every provider (shared/models/providers.ts): each request goes
// to the provider its model names, so a fallback chain may leave a provider that is down.
import type { Logger } from "../../shared/process/log.js";
import { endOfLifeWarning, LIFECYCLE_TIMEOUT_MS, type ModelLifecycle } from "../../shared/models/model-lifecycle.js";
import { resolveModel, type ProviderKind, type ProviderSpec, type Providers } from "../../shared/models/providers.js";
import { OpenAIModelClient } from "./chat-completions-model.js";
import { ModelError, type ModelChunk, type ModelClient, type ModelRequest, type ProviderClient } from "./model.js";
import { OpenAIResponsesClient } from "./responses-model.js";
import { AnthropicModelClient } from "./anthropic-model.js";
import { RequestFixes } from "./request-fixes.js";

export const PROVIDER_CLIENTS: Record<ProviderKind, new (p: ProviderSpec, fixes: RequestFixes) => ProviderClient> = {
  openai: OpenAIModelClient,
  "openai-compatible": OpenAIModelClient,
  "openai-responses": OpenAIResponsesClient,
  anthropic: AnthropicModelClient,
};

/** Streams each request from the provider its model names; one connection pool per provider. */
export class ProviderModels implements ModelClient {
  private readonly clients = new Map<string, ProviderClient>();
  /** Models whose provider this process has asked (or is asking) about their end of life: once each. */
  private readonly warned = new Set<string>();

  /** `logger`: where a model with an announced end of life is warned of, once per model. */
  constructor(
    readonly providers: Providers,
    private readonly logger?: Logger,
  ) {
    for (const p of providers.byName.values())
      this.clients.set(p.name, new PROVIDER_CLIENTS[p.kind](p, new RequestFixes(p.name, logger)));
  }

  providerOf(model: string): string {
    const found = resolveModel(this.providers, model);
    if (!found) return "unknown";
    // A compatible server is named by the operator's name for it (ollama, vllm, ...).
    const name = this.clients.get(found.provider.name)!.providerOf(found.model);
    return name === "openai_compatible" ? found.provider.name : name;
  }

  stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    const found = resolveModel(this.providers, request.model);
    if (!found) return refuse(request.model, [...this.providers.byName.keys()]);
    this.warnEndOfLife(request.model);
    // Reasoning items are the writing model's own: another model (a fallback) never gets them.
    const messages = request.messages.map((m) =>
      m.role === "assistant" && m.reasoning && m.model !== request.model ? { ...m, reasoning: undefined } : m,
    );
    return this.clients.get(found.provider.name)!.stream({ ...request, model: found.model, messages }, signal);
  }

  /**
   * What the provider of `model` (named as an agent names it) says of it: whether it serves it, and
   * until when (shared/models/model-lifecycle.ts). Contract: never throws; a model no provider serves is
   * not served.
   */
  lifecycle(model: string, signal: AbortSignal): Promise<ModelLifecycle> {
    const found = resolveModel(this.providers, model);
    if (!found) return Promise.resolve({ served: false });
    return this.clients.get(found.provider.name)!.lifecycle(found.model, signal);
  }

  /**
   * At a model's first call in this process, its provider is asked beside the call (one small
   * request, never waited for), and a warning names the day it stops serving the model.
   */
  private warnEndOfLife(model: string): void {
    if (this.warned.has(model)) return;
    this.warned.add(model);
    void this.lifecycle(model, AbortSignal.timeout(LIFECYCLE_TIMEOUT_MS)).then(({ endOfLife: day }) => {
      if (day) this.logger?.warn(endOfLifeWarning(model, day), { model, endOfLife: day });
    });
  }

  async close(): Promise<void> {
    await Promise.all([...this.clients.values()].map((c) => c.close()));
  }
}

// An async generator, so the refusal reaches the caller where every model error does: in the loop.
// biome-ignore lint/correctness/useYield: it only throws
async function* refuse(model: string, names: string[]): AsyncIterable<ModelChunk> {
  throw new ModelError(
    `no provider serves ${JSON.stringify(model)}: name it as provider/model with one of ${names.join(", ")}`,
    false,
    undefined,
    false,
    undefined,
    "model_not_found",
  );
}
