// Learning from a turn, after mem0's two-step design: the model first extracts the durable facts
// of the exchange; then, for each fact, it is shown the most similar stored memories (numbered,
// so it never has to copy an id) and answers ADD, UPDATE (which one, with what text), DELETE
// (which one) or NONE. The decisions are applied through the store's one writer and kept in the
// history. A reply that is not the JSON asked for skips that step: learning never stores guesses.
import type { Logger } from "../shared/process/log.js";
import type { ProviderSpec } from "../shared/models/providers.js";
import { endOfLifeWarning, LIFECYCLE_TIMEOUT_MS } from "../shared/models/model-lifecycle.js";
import { completionFor, type Complete, lifecycleFor } from "./completion.js";
import type { Embedder } from "./embedder.js";
import type { MemoryStore } from "./store.js";
import { newMemoryRow, type MemoryRow } from "./memory-schema.js";

/** Markers the scripted model recognises (docs/scripted-model.md); a real model reads the instructions after them. */
export const EXTRACT_MARKER = "[troupe:extract-facts]";
export const DECIDE_MARKER = "[troupe:decide-memory]";

const EXTRACT_PROMPT = `${EXTRACT_MARKER}
You extract durable facts about the user and their world from one exchange between the user and an
assistant: preferences, plans, relationships, facts about their work that will still matter in a
later conversation. Skip small talk, questions, and anything true only for this conversation. When the
user says something is no longer true, give it as a fact that starts with "[forget] ". Reply with JSON
only: {"facts": ["...", "..."]} (an empty list when there is nothing durable).`;

const DECIDE_PROMPT = `${DECIDE_MARKER}
You keep a user's long-term memory consistent. You get one new fact and the most similar stored
memories, numbered. Reply with JSON only, one of:
{"event": "ADD"} the fact is new;
{"event": "UPDATE", "n": N, "text": "..."} it changes memory N (text: the memory as it should read now);
{"event": "DELETE", "n": N} memory N is no longer true (the fact starts with "[forget] ");
{"event": "NONE"} the memories already say it.`;

export interface LearnedChange {
  event: "add" | "update" | "delete";
  memoryId: string;
  oldText: string;
  newText: string;
}

interface Exchange {
  role: string;
  text: string;
}

/** Marks, in a learned memory's provenance, who said it when not an owner. */
export const FROM = ";from:";

export class Learner {
  private readonly complete: Complete;

  constructor(
    provider: Pick<ProviderSpec, "kind" | "baseUrl" | "apiKey" | "headers">,
    /** The model as its provider names it. */
    model: string,
    private readonly store: MemoryStore,
    private readonly embedder: Embedder,
    private readonly logger: Logger,
  ) {
    this.complete = completionFor(provider, model);
    const lifecycle = lifecycleFor(provider, model);
    this.warnEndOfLife = () => {
      void lifecycle(AbortSignal.timeout(LIFECYCLE_TIMEOUT_MS)).then(({ endOfLife: day }) => {
        if (day) this.logger.warn(`learning: ${endOfLifeWarning(model, day)}`, { model, endOfLife: day });
      });
    };
  }

  /**
   * At learning's first call in this process, the provider is asked beside it (never waited for)
   * until when it serves the model, and a warning names the day; the runner does the same for its
   * models. Learning is best effort (the runner logs its failures at debug level), so when its
   * model is gone it stops quietly, and this line is what tells an operator beforehand.
   */
  private warnEndOfLife?: () => void;

  private async ask(system: string, user: string): Promise<Record<string, unknown> | undefined> {
    const text = await this.complete(system, user);
    const json = /\{[\s\S]*\}/.exec(text)?.[0];
    try {
      return json ? (JSON.parse(json) as Record<string, unknown>) : undefined;
    } catch {
      this.logger.warn("learning: the model's reply was not JSON; skipped", { reply: text.slice(0, 200) });
      return undefined;
    }
  }

  /** `source`: who said the user lines when not an owner (kept in each memory's provenance); "" for an owner. */
  async learn(
    scope: { tenant: string; owner: string; agentId: string },
    where: string,
    sessionId: string,
    exchange: Exchange[],
    source = "",
  ): Promise<LearnedChange[]> {
    this.warnEndOfLife?.();
    this.warnEndOfLife = undefined;
    const transcript = exchange.map((m) => `${m.role}: ${m.text}`).join("\n");
    const extracted = await this.ask(EXTRACT_PROMPT, transcript);
    const facts = Array.isArray(extracted?.facts)
      ? (extracted.facts as unknown[]).filter((f): f is string => typeof f === "string" && f.trim() !== "").slice(0, 20)
      : [];
    const changes: LearnedChange[] = [];
    const actor = `learn:${sessionId}`;
    for (const raw of facts) {
      const forget = raw.startsWith("[forget] ");
      const fact = forget ? raw.slice("[forget] ".length).trim() : raw.trim();
      if (fact === "") continue;
      const [vector] = await this.embedder.embed([fact]);
      const similar = (await this.store.vectorCandidates(where, vector, 5))
        .filter((c) => (c.vectorScore ?? 0) > 0.2)
        .map((c) => c.memory);
      const listed = similar.map((r, n) => `${n}: ${r.text}`).join("\n") || "(none)";
      const decision = await this.ask(DECIDE_PROMPT, `New fact: ${raw}\nStored memories:\n${listed}`);
      const event = String(decision?.event ?? "").toUpperCase();
      const target = typeof decision?.n === "number" ? similar[decision.n] : undefined;
      if (event === "ADD" && !forget) {
        const row = this.row(scope, sessionId, fact, vector, source);
        const [res] = await this.store.add(where, [row], new Set(), actor);
        if (res.outcome === "added") changes.push({ event: "add", memoryId: res.id, oldText: "", newText: fact });
      } else if (event === "UPDATE" && target && typeof decision?.text === "string" && decision.text.trim() !== "") {
        const text = decision.text.trim();
        const [v] = await this.embedder.embed([text]);
        const row = { ...this.row(scope, sessionId, text, v, source), id: target.id, created: Number(target.created) };
        const [res] = await this.store.add(where, [row], new Set([target.id]), actor);
        if (res.outcome === "updated")
          changes.push({ event: "update", memoryId: target.id, oldText: target.text, newText: text });
      } else if (event === "DELETE" && target) {
        if ((await this.store.forget(where, [target.id], actor)) > 0)
          changes.push({ event: "delete", memoryId: target.id, oldText: target.text, newText: "" });
      }
      // NONE, or a decision that names no stored memory: nothing changes.
    }
    return changes;
  }

  private row(
    scope: { tenant: string; owner: string; agentId: string },
    sessionId: string,
    text: string,
    vector: Float32Array,
    source: string,
  ): MemoryRow {
    const provenance = `extraction:${sessionId}${source ? `${FROM}${source}` : ""}`;
    return newMemoryRow({
      tenant: scope.tenant,
      owner: scope.owner,
      agent_id: scope.agentId,
      session_id: sessionId,
      text,
      vector,
      provenance,
      embedder: this.embedder.name,
    });
  }
}
