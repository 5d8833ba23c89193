// The tools a run may offer its model, by name, each made from what the run gives (ToolDeps). An
// agent's agent.json chooses among them (toolOffered, agent-config.ts); a tool is offered under
// the name its factory gives it. Adding a tool is one file exporting a factory and one line here
// (docs/extending.md); test/unit/registries.test.ts lists what is registered.
import type { MemoryService } from "../../shared/gen/troupe/v1/memory_pb.js";
import type { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { Identity } from "../../shared/auth/auth.js";
import type { Quotas } from "../../shared/auth/quotas.js";
import type { NetPolicy } from "../../shared/net/net-guard.js";
import type { ServiceClient } from "../../shared/rpc.js";
import type { AgentConfig } from "../agent-config.js";
import type { ScheduleBook } from "../schedules/schedules.js";
import type { SessionActor } from "../session/session-actor.js";
import type { Subagent } from "../session/session-log.js";
import type { BackgroundProcesses } from "./background.js";
import { delegateTool } from "./delegate.js";
import { memoryTools } from "./memory-tools.js";
import { processTool } from "./process-tool.js";
import { scheduleTool } from "./schedule-tool.js";
import { execTool, fileTools, type EgressOf, type Tool } from "./tools.js";
import { httpRequestTool, type Secrets, webFetchTool } from "./web-tools.js";

/** What a run's tools are made from: the runner's clients and the session the run is in. */
export interface ToolDeps {
  actor: SessionActor;
  /** Whose the session is: every sandbox and memory call is made as them. */
  owner: Identity;
  agentId: string;
  agentConfig(): Promise<AgentConfig>;
  /** The hosts a sandboxed command may reach, and its budget (agent.json `egress`). */
  egress: EgressOf;
  /** The quotas of the session's tenant. */
  quotas(): Quotas;
  sandbox: ServiceClient<(typeof SandboxService)["method"]>;
  memory: ServiceClient<(typeof MemoryService)["method"]>;
  /** The memories the memory tools read and write: the speaker's own. */
  memoryScope: { tenant: string; owner: string };
  /** Recall forgets that the tenant's memory was empty (a memory was saved). */
  memorySaved(): void;
  execTimeoutMs: number;
  net: NetPolicy;
  secrets: Secrets;
  background: BackgroundProcesses;
  schedules: { book: ScheduleBook; changed(): void };
  /** The frame this run answers: a schedule made now replies there. */
  answering(): Promise<string>;
  /** Children running now, per parent session, and how to make one (the registry's). */
  subagentsRunning: Map<string, number>;
  createChild(childId: string, subagent: Subagent): Promise<SessionActor>;
}

/** Makes one or more tools for a run. */
export type ToolFactory = (deps: ToolDeps) => Tool | Tool[];

export const TOOLS: Readonly<Record<string, ToolFactory>> = {
  exec: (d) => execTool(d.sandbox, d.execTimeoutMs, d.owner, d.egress),
  files: (d) => fileTools(d.sandbox, d.owner),
  process: (d) =>
    processTool(d.actor.ref, d.owner, d.sandbox, d.background, {
      max: () => d.quotas().processesPerSession,
      egress: d.egress,
    }),
  memory: (d) => memoryTools(d.memory, d.memoryScope, d.agentId, d.memorySaved),
  web_fetch: (d) => webFetchTool(d.net, d.agentConfig),
  http_request: (d) => httpRequestTool(d.net, d.agentConfig, d.secrets),
  schedule: (d) =>
    scheduleTool(d.actor.ref, { ...d.schedules, max: () => d.quotas().schedulesPerSession, origin: d.answering }),
  delegate: (d) =>
    delegateTool({
      parent: d.actor,
      agent: d.agentConfig,
      createChild: d.createChild,
      running: d.subagentsRunning,
      perRun: d.quotas().subagentsPerRun,
    }),
};

/** Every registered tool, made for one run, in registration order. */
export const toolsFor = (deps: ToolDeps): Tool[] => Object.values(TOOLS).flatMap((make) => make(deps));
