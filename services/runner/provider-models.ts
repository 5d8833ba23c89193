// The one ModelClient the loop sees over every provider (shared/providers.ts): each request goes
// to the provider its model names, so a fallback chain may leave a provider that is down.
import { resolveModel, type Providers } from "../shared/providers.js";
import { ModelError, OpenAIModelClient, type ModelChunk, type ModelClient, type ModelRequest } from "./model.js";
import { OpenAIResponsesClient } from "./responses-model.js";

/** Streams each request from the provider its model names; one connection pool per provider. */
export class ProviderModels implements ModelClient {
  private readonly clients = new Map<string, ModelClient>();

  constructor(readonly providers: Providers) {
    for (const p of providers.byName.values())
      this.clients.set(p.name, p.kind === "openai-responses" ? new OpenAIResponsesClient(p) : new OpenAIModelClient(p));
  }

  providerOf(model: string): string {
    const found = resolveModel(this.providers, model);
    return found ? (found.provider.kind === "openai-compatible" ? found.provider.name : "openai") : "unknown";
  }

  stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelChunk> {
    const found = resolveModel(this.providers, request.model);
    if (!found) return refuse(request.model, [...this.providers.byName.keys()]);
    // Reasoning items are the writing model's own: another model (a fallback) never gets them.
    const messages = request.messages.map((m) =>
      m.role === "assistant" && m.reasoning && m.model !== request.model ? { ...m, reasoning: undefined } : m,
    );
    return this.clients.get(found.provider.name)!.stream({ ...request, model: found.model, messages }, signal);
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
