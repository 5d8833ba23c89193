// What a run remembers: the memories its prompt carries, found by one search per run. Memory is an
// aid, not a dependency: a slow or failing memory service costs the run its memories, never the run.
//
// Most scopes hold no memories at all (a new user, an agent that never saved any), and a search
// per run start is a gRPC round trip on the path to the first token. When many runs start at once
// those round trips queue in the runner and dominate the start of every run. So a scope whose
// search found nothing is remembered as empty for a short while, and runs that start meanwhile
// skip the search; concurrent first searches of one scope wait for the first one's answer instead
// of all asking the same question.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { MemoryScopeSchema, MemoryService } from "../../shared/gen/troupe/v1/memory_pb.js";
import { MemoryKind } from "../../shared/gen/troupe/v1/memory_pb.js";
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, context, trace, type SpanContext } from "@opentelemetry/api";
import type { Logger } from "../../shared/process/log.js";
import type { LearningQueue } from "./learning-queue.js";
import { tracer } from "../../shared/process/telemetry.js";
import type { ServiceClient } from "../../shared/rpc.js";

type MemoryClient = ServiceClient<(typeof MemoryService)["method"]>;
type MemoryScope = MessageInitShape<typeof MemoryScopeSchema>;

export interface MemoryRecallOptions {
  /** Memories per run (0: recall is off). */
  k: number;
  /** Deadline of one search. */
  timeoutMs: number;
  /**
   * How long a scope found empty is believed empty. A memory saved elsewhere in that window
   * reaches runs this much later; one saved through this runner clears the belief at once.
   */
  emptyForMs: number;
  /** Results below this similarity are not worth the prompt's room (long-term facts excepted). */
  minScore: number;
  /**
   * Long-term facts (fact and profile memories) every run gets, whatever the question, up to this
   * many: who the speaker is must not depend on the question being near it (seed PocketPaw 002).
   */
  longTermK: number;
  /** The most scopes believed empty that are kept (default 10,000, each some 100 bytes). */
  emptyScopesKept?: number;
}

export const DEFAULT_RECALL: Omit<MemoryRecallOptions, "k"> = {
  timeoutMs: 500,
  emptyForMs: 5000,
  minScore: 0.3,
  longTermK: 20,
};

const isLongTerm = (kind: MemoryKind) => kind === MemoryKind.FACT || kind === MemoryKind.PROFILE;

export class MemoryRecall {
  /** Scope -> time until which it is believed to hold no memories. */
  private readonly emptyUntil = new Map<string, number>();
  /** Scope -> the first search of a scope not known to be empty, while it is in flight. */
  private readonly probes = new Map<string, Promise<boolean>>();
  /** Searches skipped because their scope was known to be empty (for tests and stats). */
  skipped = 0;

  constructor(
    private readonly memory: MemoryClient,
    private readonly options: MemoryRecallOptions,
    private readonly logger: Logger,
  ) {}

  /** The memories in `scope` relevant to `query`, best first; [] when there are none. */
  async recall(scope: MemoryScope, query: string, signal: AbortSignal): Promise<Recalled[]> {
    if (this.options.k === 0) return [];
    const key = scopeKey(scope);
    if ((this.emptyUntil.get(key) ?? 0) > Date.now()) {
      this.skipped++;
      return [];
    }
    const probe = this.probes.get(key);
    if (probe) {
      // Someone is asking already; if the scope turns out empty there is nothing to find here either.
      if (await probe) {
        this.skipped++;
        return [];
      }
      return (await this.search(scope, key, query, signal)).texts;
    }
    const first = this.search(scope, key, query, signal);
    const isEmpty = first.then((r) => r.empty);
    this.probes.set(key, isEmpty);
    void isEmpty.finally(() => this.probes.delete(key));
    return (await first).texts;
  }

  /** Drops what is believed about every scope of a tenant (a memory was saved there; owner views span owners). */
  invalidateTenant(tenant: string): void {
    const prefix = `${JSON.stringify([tenant]).slice(0, -1)},`;
    for (const key of this.emptyUntil.keys()) if (key.startsWith(prefix)) this.emptyUntil.delete(key);
  }

  /**
   * Remembers that a scope is empty for a while. Scopes carry client-chosen agent ids, so the map
   * is bounded: what has run out goes, and the oldest beliefs if it is still full. Every belief
   * lasts emptyForMs and is set anew at the back, so the map's order is expiry order and both are
   * at the front: amortised O(1), not a sweep of the map.
   */
  private believeEmpty(key: string): void {
    const now = Date.now();
    const kept = this.options.emptyScopesKept ?? 10_000;
    this.emptyUntil.delete(key);
    for (const [k, until] of this.emptyUntil) {
      if (until > now && this.emptyUntil.size < kept) break;
      this.emptyUntil.delete(k);
    }
    this.emptyUntil.set(key, now + this.options.emptyForMs);
  }

  /** Scopes believed empty (for tests). */
  get emptyScopes(): number {
    return this.emptyUntil.size;
  }

  /** One search: the relevant texts, and whether the scope holds no memory at all (false if the search failed). */
  private async search(
    scope: MemoryScope,
    key: string,
    query: string,
    signal: AbortSignal,
  ): Promise<{ texts: Recalled[]; empty: boolean }> {
    // The recall's own span: the search under it, and what came back.
    const span = tracer.startSpan("recall memories", {
      kind: SpanKind.INTERNAL,
      attributes: { "troupe.memory.k": this.options.k },
    });
    try {
      const res = await context.with(trace.setSpan(context.active(), span), () =>
        this.memory.searchMemories(
          { scope, query, k: this.options.k, longTermK: this.options.longTermK },
          { timeoutMs: this.options.timeoutMs, signal },
        ),
      );
      span.setAttribute("troupe.memory.results", res.results.length);
      // A vector search returns the nearest memories whatever their score: none at all means none exist.
      const empty = res.results.length === 0;
      if (empty) this.believeEmpty(key);
      else this.emptyUntil.delete(key);
      const texts = res.results
        .filter(
          (r) =>
            r.memory !== undefined &&
            r.memory.kind !== MemoryKind.UNSPECIFIED &&
            (r.score >= this.options.minScore || isLongTerm(r.memory.kind)),
        )
        .map((r) => ({ text: r.memory!.text, kind: r.memory!.kind, source: sourceOf(r.memory!.provenance) }));
      return { texts, empty };
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: String((err as Error).message ?? err) });
      this.logger.debug("memory search skipped", { error: String((err as Error).message ?? err) });
      return { texts: [], empty: false };
    } finally {
      span.end();
    }
  }
}

/** One recalled memory: its text and whether it is a fact, a profile entry, an episode or a note. */
export interface Recalled {
  text: string;
  kind: MemoryKind;
  /** Who said it, when learned from someone who is not an owner of the agent. */
  source?: string;
}

/** The non-owner a learned memory came from (memory/learn.ts writes ";from:<source>"), if any. */
function sourceOf(provenance: string): string | undefined {
  const at = provenance.indexOf(";from:");
  return at < 0 ? undefined : provenance.slice(at + ";from:".length) || undefined;
}

function scopeKey(scope: MemoryScope): string {
  return JSON.stringify([scope.tenant ?? "", scope.owner ?? "", scope.agentId ?? "", scope.allOwners ?? false]);
}

/** Learns from a run's exchange for one owner's scope. Contract: never throws, never blocks. */
export type Learn = (
  scope: { tenant: string; owner: string },
  agentId: string,
  sessionId: string,
  exchange: { role: string; text: string }[],
  /** Who said it when not the owner (learned as their claim); empty: the owner. */
  source: string,
  /** The run's span, which the learning's own trace links to. */
  turn?: SpanContext,
) => void;

/**
 * Learning after each completed run, in the background (TROUPE_MEMORY_LEARN=0 turns it off): the
 * memory service extracts and stores what is worth keeping; a failure costs only the learning.
 * It waits in `queue` while the runner is busy (learning-queue.ts), and is traced on its own,
 * linked to the run's span: it is not part of the answer.
 */
export function learnAfterRuns(
  memory: MemoryClient,
  recall: MemoryRecall,
  queue: LearningQueue,
  logger: Logger,
): Learn {
  return (scope, agentId, sessionId, exchange, source, turn) =>
    queue.add(() => {
      const span = tracer.startSpan("learn", { root: true, links: turn ? [{ context: turn }] : [] });
      return context
        .with(trace.setSpan(ROOT_CONTEXT, span), () =>
          memory.learnFromTurn(
            { scope: { ...scope, agentId }, sessionId, messages: exchange, source },
            { timeoutMs: 120_000 },
          ),
        )
        .finally(() => span.end())
        .then(
          (res) => res.changes.length > 0 && recall.invalidateTenant(scope.tenant),
          (err: unknown) =>
            logger.debug("learning from a turn failed", {
              session: sessionId,
              error: String((err as Error).message ?? err),
            }),
        );
    });
}
