// Hooks: operator code that watches or changes a turn at fixed points. They run in this order
// within a turn (docs/turn-pipeline.md):
//
//   message_received      observing   each user message as it enters the run
//   before_model_resolve  modifying   may pick another model for the run
//   before_prompt_build   modifying   may add instructions to this run's system prompt
//   before_tool_call      modifying   may block a call (with a reason) or change its arguments
//   after_tool_call       modifying   may amend a call's result
//   agent_end             observing   the run is over
//
// Modifying hooks run one after another, highest priority first (ties in registration order),
// each seeing what the previous one returned. Observing hooks run side by side and never hold the
// turn up. A modifying hook that throws or passes its timeout is reported by event and skipped,
// except before_tool_call, which fails closed: the call is blocked.
//
// Hooks come from plugin modules (TROUPE_HOOKS, comma-separated paths). Each exports
// `register(api: PluginApi)`; see examples/hooks/.
import type { ToolResult } from "../tools/tools.js";

export interface TurnInfo {
  sessionId: string;
  agentId: string;
  /** Who sent the run's messages (principal, or channel identity). */
  sender: string;
}

export interface HookPayloads {
  message_received: TurnInfo & { frameId: string; text: string };
  before_model_resolve: TurnInfo & { model: string };
  before_prompt_build: TurnInfo & { query: string };
  before_tool_call: TurnInfo & { toolCallId: string; toolName: string; args: Record<string, unknown> };
  after_tool_call: TurnInfo & {
    toolCallId: string;
    toolName: string;
    args: Record<string, unknown>;
    result: ToolResult;
  };
  agent_end: TurnInfo & { stopReason: string; errorMessage: string };
}

export interface HookResults {
  message_received: void;
  before_model_resolve: { model?: string } | void;
  before_prompt_build: { instruction?: string } | void;
  before_tool_call: { block?: boolean; reason?: string; args?: Record<string, unknown> } | void;
  after_tool_call: { output?: string; isError?: boolean } | void;
  agent_end: void;
}

export type HookName = keyof HookPayloads;
/** What a modifying hook may return, once it returned something. */
export type HookChange<N extends HookName> = Exclude<HookResults[N], void | undefined>;
export type HookHandler<N extends HookName> = (
  payload: HookPayloads[N],
  signal: AbortSignal,
) => HookResults[N] | Promise<HookResults[N]>;

const DEFAULT_TIMEOUT_MS: Record<HookName, number> = {
  message_received: 5000,
  before_model_resolve: 5000,
  before_prompt_build: 5000,
  before_tool_call: 15_000,
  after_tool_call: 5000,
  agent_end: 5000,
};

export interface HookOptions {
  /** Higher runs first. */
  priority?: number;
  timeoutMs?: number;
  /** For reports; defaults to the plugin's file name. */
  name?: string;
}

export type ThreatLevel = "none" | "low" | "medium" | "high";
export interface ThreatVerdict {
  level: ThreatLevel;
  reason?: string;
}
export type ThreatCheck = (
  text: string,
  info: TurnInfo & { frameId: string },
  signal: AbortSignal,
) => ThreatVerdict | Promise<ThreatVerdict>;

/** What a plugin module's `register` receives. */
export interface PluginApi {
  on<N extends HookName>(name: N, handler: HookHandler<N>, options?: HookOptions): void;
  /** A check every inbound message passes before its turn; "high" blocks the message. */
  threatCheck(name: string, check: ThreatCheck, options?: { timeoutMs?: number }): void;
}

interface Registered {
  name: string;
  priority: number;
  order: number;
  timeoutMs: number;
  handler: HookHandler<never>;
}

/** A hook that failed: reported to the client as a HOOK_ERROR event. */
export interface HookFailure {
  hook: HookName;
  name: string;
  message: string;
}

export class HookTimeout extends Error {}

/** Runs `fn` with a deadline; the signal it gets is aborted when the deadline passes. */
export async function withTimeout<T>(
  fn: (signal: AbortSignal) => T | Promise<T>,
  timeoutMs: number,
  what: string,
): Promise<T> {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      controller.abort();
      reject(new HookTimeout(`${what} did not answer within ${timeoutMs} ms`));
    }, timeoutMs);
  });
  try {
    return await Promise.race([Promise.resolve().then(() => fn(controller.signal)), deadline]);
  } finally {
    clearTimeout(timer);
  }
}

export class Hooks {
  private readonly handlers = new Map<HookName, Registered[]>();
  readonly threatChecks: { name: string; timeoutMs: number; check: ThreatCheck }[] = [];
  private order = 0;

  /** The API one plugin registers through; `source` names its hooks in reports. */
  api(source: string): PluginApi {
    return {
      on: (name, handler, options = {}) => {
        if (!(name in DEFAULT_TIMEOUT_MS))
          throw new Error(
            `${source}: there is no hook named ${String(name)} (known: ${Object.keys(DEFAULT_TIMEOUT_MS).join(", ")})`,
          );
        const list = this.handlers.get(name) ?? [];
        list.push({
          name: options.name ?? source,
          priority: options.priority ?? 0,
          order: this.order++,
          timeoutMs: options.timeoutMs ?? DEFAULT_TIMEOUT_MS[name],
          handler: handler as unknown as HookHandler<never>,
        });
        list.sort((a, b) => b.priority - a.priority || a.order - b.order);
        this.handlers.set(name, list);
      },
      threatCheck: (name, check, options = {}) => {
        this.threatChecks.push({ name, check, timeoutMs: options.timeoutMs ?? 5000 });
      },
    };
  }

  /** Observing hooks: started side by side, never awaited by the turn. Failures go to `onFailure`. */
  observe<N extends "message_received" | "agent_end">(
    name: N,
    payload: HookPayloads[N],
    onFailure: (f: HookFailure) => void,
  ): void {
    for (const h of this.handlers.get(name) ?? []) {
      withTimeout(
        (signal) => (h.handler as unknown as HookHandler<N>)(payload, signal),
        h.timeoutMs,
        `hook ${name} (${h.name})`,
      ).catch((err: unknown) => onFailure({ hook: name, name: h.name, message: errorText(err) }));
    }
  }

  /**
   * Modifying hooks in priority order. `apply` folds each result into the next payload. A failing
   * hook is reported and skipped; with `failClosed`, the first failure ends the chain and is returned.
   */
  async modify<N extends Exclude<HookName, "message_received" | "agent_end">>(
    name: N,
    payload: HookPayloads[N],
    apply: (payload: HookPayloads[N], result: HookChange<N>) => { payload: HookPayloads[N]; stop?: boolean },
    options: { failClosed?: boolean } = {},
  ): Promise<{ payload: HookPayloads[N]; failures: HookFailure[]; closedBy?: HookFailure }> {
    const failures: HookFailure[] = [];
    let current = payload;
    for (const h of this.handlers.get(name) ?? []) {
      try {
        const result = await withTimeout(
          (signal) => (h.handler as unknown as HookHandler<N>)(current, signal),
          h.timeoutMs,
          `hook ${name} (${h.name})`,
        );
        if (result === undefined || result === null) continue;
        if (typeof result !== "object") throw new Error(`returned ${typeof result}, not an object`);
        const next = apply(current, result as HookChange<N>);
        current = next.payload;
        if (next.stop) break;
      } catch (err) {
        const failure = { hook: name, name: h.name, message: errorText(err) };
        if (options.failClosed) return { payload: current, failures, closedBy: failure };
        failures.push(failure);
      }
    }
    return { payload: current, failures };
  }
}

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** Loads plugin modules: each must export `register(api)`. A module that cannot load stops the runner. */
export async function loadPlugins(hooks: Hooks, modules: readonly string[]): Promise<void> {
  for (const file of modules) {
    let mod: { register?: (api: PluginApi) => unknown };
    try {
      mod = await import(new URL(`file://${file}`).href);
    } catch (err) {
      throw new Error(`plugin ${file} could not be loaded: ${errorText(err)}`);
    }
    if (typeof mod.register !== "function") throw new Error(`plugin ${file} exports no register(api) function`);
    await mod.register(hooks.api(file.split("/").pop() ?? file));
  }
}
