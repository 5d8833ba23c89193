// The turn tests' stack: operator files (agents/ with one agent per behaviour under test, a
// routing file, a hooks plugin) written before a whole stack starts with the scripted model; and
// small readers of a turn's events.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Role, type AgentEvent } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "./session.js";
import { startStack, type Stack } from "./stack.js";

const PLUGIN = `
import { appendFileSync } from "node:fs";
const trail = process.env.HOOK_TRAIL;
export function register(api) {
  api.on("before_prompt_build", () => ({ instruction: "INSTRUCTION-B (priority 1)" }), { priority: 1 });
  api.on("before_prompt_build", () => ({ instruction: "INSTRUCTION-A (priority 10)" }), { priority: 10 });
  api.on("before_prompt_build", (p) => { if (p.query.includes("hook-throw")) throw new Error("deliberate hook failure"); });
  api.on("before_prompt_build", (p, signal) => p.query.includes("hook-hang") ? new Promise(() => {}) : undefined, { timeoutMs: 300, name: "hanger" });
  api.on("message_received", (p) => { appendFileSync(trail, "received " + p.text + "\\n"); if (p.text.includes("slow-observer")) return new Promise(() => {}); });
  api.on("agent_end", (p) => appendFileSync(trail, "end " + p.stopReason + "\\n"));
  api.on("before_tool_call", (p) => {
    if (p.toolName === "exec" && String(p.args.command).includes("forbidden")) return { block: true, reason: "no forbidden commands" };
    if (p.toolName === "exec" && p.args.command === "rewrite-me") return { args: { command: "echo rewritten" } };
    if (p.toolName === "list_files" && p.args.path === "hang") return new Promise(() => {});
  }, { timeoutMs: 300, name: "guard" });
  api.on("after_tool_call", (p) => p.toolName === "exec" && p.args.command === "echo amend" ? { output: p.result.output + "[amended by hook]" } : undefined);
  api.threatCheck("keyword-guard", (text) => {
    if (text.includes("guard-crash")) throw new Error("the guard crashed");
    return text.includes("EVIL-PAYLOAD") ? { level: "high", reason: "carries the evil payload" } : { level: "none" };
  });
}
`;

const json = (v: unknown) => JSON.stringify(v, null, 1);
const FAST_RETRY = { maxRetries: 2, baseDelayMs: 20, maxDelayMs: 5000 };

/** The stack every turn test runs against, with the operator files above. */
export interface TurnStack {
  stack: Stack;
  dataDir: string;
  /** Opens (creating) a session of `agentId` through the gateway. */
  open(agentId?: string, sessionId?: string): Promise<ChatSession>;
  stop(): Promise<void>;
}

export async function startTurnStack(): Promise<TurnStack> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-turns-"));
  const agentsDir = path.join(dataDir, "agents");
  const write = async (rel: string, content: string | Buffer) => {
    await mkdir(path.dirname(path.join(agentsDir, rel)), { recursive: true });
    await writeFile(path.join(agentsDir, rel), content);
  };
  await write("AGENTS.md", "Every agent: be brief.");
  await write("TOOLS.md", "Reference: the sandbox has busybox.");
  await write(
    "main/agent.json",
    json({
      name: "Ada",
      persona: "A careful research aide who answers in plain words.",
      retry: FAST_RETRY,
      subagents: { maxDepth: 1, maxChildren: 2, timeoutMs: 60_000 },
    }),
  );
  await write("main/SOUL.md", "Ada's soul: curious and exact.");
  await write("main/skills/weather.md", "Skill: to check the weather, say you cannot.");
  await write("main/sessions/local/dev/ctx-override/AGENTS.md", "This session only: answer in French.");
  await write(
    "compact/agent.json",
    json({
      contextWindow: 3000,
      reserveTokens: 600,
      keepRecentTokens: 500,
      maxOutputTokens: 256,
      retry: FAST_RETRY,
      // The window is sized for these tools' schemas; the others would not leave room to compact in.
      tools: [
        "exec",
        "read_file",
        "write_file",
        "list_files",
        "memory_search",
        "memory_save",
        "memory_forget",
        "delegate_task",
      ],
    }),
  );
  await write("tight/agent.json", json({ keepRecentTokens: 0, retry: FAST_RETRY }));
  await write(
    "fallback/agent.json",
    json({ model: "primary", fallbacks: ["backup"], retry: { maxRetries: 1, baseDelayMs: 20 } }),
  );
  await write("badfiles/agent.json", json({ retry: FAST_RETRY }));
  await write("badfiles/AGENTS.md", Buffer.from([0x23, 0x20, 0x00, 0x01, 0x02, 0xff, 0xfe]));
  await write("badfiles/SOUL.md", `${"soul ".repeat(2000)}END-OF-SOUL`);
  await write("brokenconfig/agent.json", "{ not json");
  await writeFile(path.join(dataDir, "routing.json"), json({ session: { dmScope: "per-channel-peer" } }));
  const plugin = path.join(dataDir, "plugin.mjs");
  await writeFile(plugin, PLUGIN);
  const stack = await startStack({
    dataDir,
    env: {
      TROUPE_HOOKS: plugin,
      HOOK_TRAIL: path.join(dataDir, "hook-trail.log"),
      TROUPE_MIN_HEARTBEAT_S: "1",
      TROUPE_MEMORY_LEARN: "0",
    },
  });
  return {
    stack,
    dataDir,
    async open(agentId = "main", sessionId = "") {
      const s = new ChatSession(stack.gateway);
      s.send({ case: "open", value: { sessionId, agentId, create: true } });
      await s.waitOpened();
      return s;
    },
    async stop() {
      await stack.stop();
      // The stack removes only a data directory it made itself.
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

export const of = <K extends AgentEvent["payload"]["case"]>(events: AgentEvent[], kase: K) =>
  events
    .filter((e) => e.payload.case === kase)
    .map((e) => e.payload.value as Extract<AgentEvent["payload"], { case: K }>["value"]);
export const endOf = (events: AgentEvent[]) => of(events, "agentEnd").at(-1)!;
export const replyOf = (events: AgentEvent[]) =>
  of(events, "messageEnd")
    .filter((v) => v.message?.role === Role.ASSISTANT)
    .at(-1)?.message?.text ?? "";
