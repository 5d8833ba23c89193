// Tools the client runs itself (ClientTool): declared for a session (OpenSession) or for one
// prompt's run, offered to the model beside the agent's own. A call to one is not executed here:
// the loop sends it to the client (ClientToolCall) and the run waits for the client's result
// (tool-calls.ts). Their fields were checked at the edge (shared/frames.ts validateClientTools).
import type { ClientTool } from "../../shared/gen/troupe/v1/session_pb.js";
import type { Tool } from "./tools.js";

/** A client tool as the loop uses it: its schema parsed. */
export interface ClientToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

const ANY_OBJECT = { type: "object" };

/** The specs of declared tools (an empty schema is any JSON object). */
export function clientToolSpecs(
  tools: readonly Pick<ClientTool, "name" | "description" | "parametersJson">[],
): ClientToolSpec[] {
  return tools.map((t) => ({
    name: t.name,
    description: t.description,
    parameters: t.parametersJson.trim() === "" ? ANY_OBJECT : (JSON.parse(t.parametersJson) as Record<string, unknown>),
  }));
}

/** As the loop's tools: marked `client`, never executed here. */
export function asTools(specs: readonly ClientToolSpec[]): Tool[] {
  return specs.map((s) => ({
    ...s,
    client: true,
    execute: () => Promise.reject(new Error(`${s.name} is a client tool: the client runs it`)),
  }));
}

/** The names in `specs` that are also the agent's tools' (a client tool may not shadow one). */
export const shadowed = (specs: readonly ClientToolSpec[], agentTools: readonly Tool[]): string[] =>
  specs.filter((s) => agentTools.some((t) => t.name === s.name)).map((s) => s.name);

/** The union of tool lists by name, later lists replacing earlier ones' entries. */
export function mergeSpecs(...lists: (readonly ClientToolSpec[] | undefined)[]): ClientToolSpec[] {
  const byName = new Map<string, ClientToolSpec>();
  for (const list of lists) for (const s of list ?? []) byName.set(s.name, s);
  return [...byName.values()];
}
