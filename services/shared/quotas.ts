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
import { ReloadingFile } from "./reloading-file.js";

export interface Quotas {
  /** Sandboxes a tenant may have at once (sandbox service). */
  liveSandboxes: number;
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
}

export const DEFAULT_QUOTAS: Quotas = {
  liveSandboxes: 32,
  concurrentRuns: 64,
  stepsPerRun: 50,
  toolCallsPerRun: 200,
  subagentsPerRun: 10,
  sessionsPerMinute: 600,
  abortsPerSecond: 20,
};

const NAMES = Object.keys(DEFAULT_QUOTAS) as (keyof Quotas)[];
const envName = (k: keyof Quotas) => `TROUPE_QUOTA_${k.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`;

function positive(value: unknown, where: string): number {
  const n = typeof value === "string" ? Number(value) : value;
  if (typeof n !== "number" || !Number.isInteger(n) || n <= 0)
    throw new Error(`${where} must be a positive integer, got ${JSON.stringify(value)}`);
  return n;
}

/** The defaults with the environment's overrides. */
export function quotasFromEnv(env: NodeJS.ProcessEnv): Quotas {
  const q = { ...DEFAULT_QUOTAS };
  for (const k of NAMES) {
    const v = env[envName(k)];
    if (v !== undefined && v !== "") q[k] = positive(v, envName(k));
  }
  return q;
}

interface QuotasFile {
  defaults: Partial<Quotas>;
  tenants: Map<string, Partial<Quotas>>;
}

function partial(obj: unknown, where: string): Partial<Quotas> {
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) throw new Error(`${where} must be an object`);
  const out: Partial<Quotas> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (!NAMES.includes(k as keyof Quotas)) throw new Error(`${where}.${k} is not a quota (${NAMES.join(", ")})`);
    out[k as keyof Quotas] = positive(v, `${where}.${k}`);
  }
  return out;
}

export function parseQuotas(text: string, source: string): QuotasFile {
  let doc: { defaults?: unknown; tenants?: unknown };
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new Error(`${source}: not JSON (${(err as Error).message})`);
  }
  const tenants = new Map<string, Partial<Quotas>>();
  if (doc.tenants !== undefined) {
    if (typeof doc.tenants !== "object" || doc.tenants === null)
      throw new Error(`${source}: tenants must be an object`);
    for (const [t, q] of Object.entries(doc.tenants)) tenants.set(t, partial(q, `${source}: tenants.${t}`));
  }
  return { defaults: doc.defaults === undefined ? {} : partial(doc.defaults, `${source}: defaults`), tenants };
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
