// Quotas per tenant, so that one tenant cannot take a small machine from the others. Each service
// enforces its own: the sandbox service live sandboxes, the runner runs (at once, and the steps,
// tool calls and sub-agents of one run) and session creations, the gateway aborts. Over a quota a
// call fails with RESOURCE_EXHAUSTED and a retry hint (rate.ts); inside a run, the run ends with
// an error event saying which quota it met. Never a crash.
//
// Defaults come from the environment (TROUPE_QUOTA_<NAME>, e.g. TROUPE_QUOTA_CONCURRENT_RUNS);
// the quotas file (<data-dir>/quotas.json, or TROUPE_QUOTAS_FILE) sets defaults and tenants of
// its own, and is read again when it changes:
//   { "defaults": { "concurrentRuns": 32 }, "tenants": { "acme": { "liveSandboxes": 100 } } }
// The counts are per process (per runner, per sandbox service): with several runners a tenant may
// have as many concurrent runs on each.
import { parseJson, schemaProblems } from "../json-schema.js";
import { ReloadingFile } from "../config/reloading-file.js";

export interface Quotas {
  /** Sandboxes a tenant may have at once (sandbox service). */
  liveSandboxes: number;
  /** MiB of saved workspaces and snapshots a tenant may keep (sandbox service). */
  workspaceMegabytes: number;
  /** Runs going at once (runner). */
  concurrentRuns: number;
  /** Model calls in one run (runner). */
  stepsPerRun: number;
  /** Tool calls in one run (runner). */
  toolCallsPerRun: number;
  /** Sub-agents one run may start, in all (runner). */
  subagentsPerRun: number;
  /** New sessions a minute, on average and as a burst (runner). */
  sessionsPerMinute: number;
  /** Abort frames a second, on average; twice that as a burst (gateway). */
  abortsPerSecond: number;
  /** Schedules one session may hold, made by its clients or by the agent (runner). */
  schedulesPerSession: number;
  /** Background processes (the process tool) running at once in one session (runner). */
  processesPerSession: number;
}

export const DEFAULT_QUOTAS: Quotas = {
  liveSandboxes: 32,
  workspaceMegabytes: 4096,
  concurrentRuns: 64,
  stepsPerRun: 50,
  toolCallsPerRun: 200,
  subagentsPerRun: 10,
  sessionsPerMinute: 600,
  abortsPerSecond: 20,
  schedulesPerSession: 20,
  processesPerSession: 4,
};

interface QuotasFile {
  defaults: Partial<Quotas>;
  tenants: Map<string, Partial<Quotas>>;
}

/** The quotas file, checked against shared/schemas/quotas.schema.json. */
export function parseQuotas(text: string, source: string): QuotasFile {
  const doc = parseJson(text, source);
  const problems = schemaProblems("quotas", doc);
  if (problems.length > 0) throw new Error(`${source}: ${problems.join("; ")}`);
  const d = doc as { defaults?: Partial<Quotas>; tenants?: Record<string, Partial<Quotas>> };
  return { defaults: d.defaults ?? {}, tenants: new Map(Object.entries(d.tenants ?? {})) };
}

/** The quotas in force for each tenant. */
export class TenantQuotas {
  private readonly file?: ReloadingFile<QuotasFile>;

  constructor(
    private readonly base: Quotas,
    file?: string,
  ) {
    if (file) this.file = new ReloadingFile(file, parseQuotas, { defaults: {}, tenants: new Map() });
  }

  /** Reads the file (a missing one is none); watches it for changes every 2 s, reporting a bad one to `onError`. */
  async start(onError: (err: unknown) => void): Promise<this> {
    if (this.file) {
      await this.file.reload();
      this.file.watch(2000, onError);
    }
    return this;
  }

  stop(): void {
    this.file?.stop();
  }

  of(tenant: string): Quotas {
    const f = this.file?.value;
    return { ...this.base, ...f?.defaults, ...f?.tenants.get(tenant) };
  }
}
