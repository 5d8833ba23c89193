// Tool calls: arguments parsed and checked against each tool's schema, the approval policy
// (a call may wait for a person's decision), before/after hooks, parallel groups where the tools
// allow, steering looked for before each group, results paired with their calls (skipped ones
// too), and the run's quota of tool calls.
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { Ajv, type ValidateFunction } from "ajv";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import {
  ChatMessageSchema,
  Role,
  StopReason,
  ToolVerdict,
  type ChatMessage,
  type ToolCall,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { approvalOf } from "../tools/approvals.js";
import { newId } from "../../shared/ids.js";
import { instruments, secondsSince } from "../../shared/process/metrics.js";
import { GenAI, tracer } from "../../shared/process/telemetry.js";
import type { Tool, ToolResult } from "../tools/tools.js";
import { hookFailed, pushMessage, report, type QueuedMessage, type RunHost, type Turn } from "./run.js";

const SKIPPED_BY_STEER = "Skipped due to queued user message.";
const SKIPPED_BY_ABORT = "Not run: the run was aborted.";

/** What a batch left: steering to inject before the next model call, or the calls the run now waits on. */
export interface BatchEnd {
  steering: QueuedMessage[];
  /** The calls of the batch held for a decision: the run stops here (RunWaiting) and goes on once they are decided. */
  waiting?: string[];
}

/**
 * Runs the batch in the model's order. Consecutive calls of tools that declare themselves
 * parallel run together; any other call runs alone. Before each group the steering queue is read:
 * if a message is waiting, this group and the rest are skipped with paired results, and the
 * steering messages are returned to be injected before the next model call. A group with a call
 * the approval policy holds for a decision does not start: its held calls are announced
 * (ToolApprovalRequested) and the batch ends waiting. A call that is already running always
 * finishes (or is cancelled by an abort).
 */
export async function executeToolCalls(turn: Turn, assistant: ChatMessage): Promise<BatchEnd> {
  const { host, deps } = turn;
  const calls = assistant.toolCalls;
  const parallel = (c: ToolCall) => deps.tools.find((t) => t.name === c.name)?.parallel === true;
  for (let i = 0; i < calls.length; ) {
    if (host.signal.aborted) {
      skipCalls(host, calls.slice(i), SKIPPED_BY_ABORT);
      return { steering: [] };
    }
    const steering = host.takeSteering();
    if (steering.length > 0) {
      const skipped = calls.slice(i);
      host.emit({
        case: "toolCallsSkipped",
        value: { frameId: steering[0].frameId, toolCallIds: skipped.map((c) => c.id) },
      });
      skipCalls(host, skipped, SKIPPED_BY_STEER);
      return { steering };
    }
    if (assistant.stopReason === StopReason.LENGTH) {
      finishCall(
        host,
        calls[i],
        {
          output: "The reply hit the output limit, so these arguments may be truncated; the call was not run.",
          isError: true,
        },
        false,
      );
      i++;
      continue;
    }
    if (turn.budget.toolCalls <= 0) {
      // Over the tenant's quota of tool calls for one run: the rest are answered, not run.
      skipCalls(
        host,
        calls.slice(i),
        "Not run: this run reached its quota of tool calls (toolCallsPerRun). Answer with what you have.",
      );
      return { steering: host.takeSteering() };
    }
    let end = i + 1;
    if (parallel(calls[i])) while (end < calls.length && parallel(calls[end]) && end - i < turn.budget.toolCalls) end++;
    const group = calls.slice(i, end);
    const gates = group.map((call) => gateOf(turn, call));
    const held = group.filter((_, k) => gates[k].kind === "wait");
    if (held.length > 0) {
      // Every held call of the rest of the batch is asked now: a person decides on the batch
      // at once, and the run goes on when all of it is decided.
      const rest = calls.slice(i);
      const restGates = [...gates, ...calls.slice(end).map((call) => gateOf(turn, call))];
      const waiting = rest.filter((_, k) => restGates[k].kind === "wait");
      for (const [k, call] of rest.entries()) {
        const gate = restGates[k];
        if (gate.kind !== "wait" || host.isHeld(call.id, gate.hold)) continue;
        const deadline = timestampFromMs(Date.now() + gate.timeoutMs);
        const { argumentsJson } = gate;
        if (gate.hold === "client")
          host.emit({
            case: "clientToolCall",
            value: { toolCallId: call.id, toolName: call.name, argumentsJson, deadline },
          });
        else
          host.emit({
            case: "toolApprovalRequested",
            value: {
              toolCallId: call.id,
              toolName: call.name,
              argumentsJson,
              rule: gate.rule,
              deadline,
              onTimeout: gate.onTimeout,
              principal: deps.principal,
            },
          });
      }
      return { steering: [], waiting: waiting.map((c) => c.id) };
    }
    turn.budget.toolCalls -= group.length;
    const results = await Promise.all(
      group.map(async (call, k) => {
        const gate = gates[k];
        if (gate.kind === "answer") return gate.result;
        const edited = gate.kind === "run" ? gate.edited : undefined;
        let result = await runToolCall(turn, edited ? { ...call, argumentsJson: edited.json } : call);
        // The model asked with other arguments: it is told what ran.
        if (edited)
          result = {
            ...result,
            output: `(This call ran with arguments edited by ${edited.by}: ${edited.json})\n${result.output}`,
          };
        return deps.screenToolResult ? deps.screenToolResult(call, result) : result;
      }),
    );
    for (const [k, call] of group.entries()) {
      const gate = gates[k];
      if (gate.kind === "answer") {
        host.emit({
          case: "toolExecutionStart",
          value: { toolCallId: call.id, toolName: call.name, argumentsJson: call.argumentsJson },
        });
      }
      finishCall(host, call, results[k], gate.kind === "answer" && !gate.ran);
    }
    i = end;
  }
  return { steering: host.takeSteering() };
}

/** What the approval policy, the decisions taken and the client's answers make of one call. */
type Gate =
  | { kind: "run"; edited?: { json: string; by: string } }
  /** Answered without running here: denied, rejected (`ran` false), or run by the client (`ran`). */
  | { kind: "answer"; result: ToolResult; ran?: boolean }
  /** Held: for a person's decision, or for the client's result (with the arguments it gets). */
  | {
      kind: "wait";
      hold: "approval" | "client";
      rule: string;
      timeoutMs: number;
      onTimeout: string;
      argumentsJson: string;
    };

const RUN: Gate = { kind: "run" };

/**
 * The policy's word on a call, with the decision on it if one came; then, for a client tool, the
 * client's answer if one came. A call whose tool is unknown or whose arguments are off its
 * schema runs (runToolCall answers it with why): it cannot do anything, so nobody is asked.
 */
function gateOf(turn: Turn, call: ToolCall): Gate {
  const { host, deps } = turn;
  const tool = deps.tools.find((t) => t.name === call.name);
  if (!tool || (!turn.agent.approvals && !tool.client && !tool.mcp)) return RUN;
  let args: Record<string, unknown>;
  try {
    args = parseArguments(tool, call);
  } catch {
    return RUN;
  }
  const verdict = approvalOf(turn.agent.approvals, deps.tenant, call.name, args, tool.mcp);
  let gate: Gate = RUN;
  if (verdict.mode === "deny")
    return {
      kind: "answer",
      result: { output: `Not run: the approval policy denies this call (${verdict.rule}).`, isError: true },
    };
  if (verdict.mode === "ask") {
    const decision = host.decisionOf(call.id);
    if (!decision) return { kind: "wait", hold: "approval", ...verdict, argumentsJson: call.argumentsJson };
    if (decision.verdict === ToolVerdict.REJECT) {
      const by = decision.decidedBy === TIMED_OUT ? "nobody decided in time, so the policy" : decision.decidedBy;
      return {
        kind: "answer",
        result: {
          output: `Not run: ${by} rejected this call${decision.message ? `: ${decision.message}` : "."}`,
          isError: true,
        },
      };
    }
    if (decision.verdict === ToolVerdict.EDIT)
      gate = { kind: "run", edited: { json: decision.argumentsJson, by: decision.decidedBy } };
  }
  if (!tool.client) return gate;
  // The client runs it, with the arguments a person may have edited.
  const answered = host.clientResultOf(call.id);
  if (answered) return { kind: "answer", result: answered, ran: true };
  const argumentsJson = gate.kind === "run" && gate.edited ? gate.edited.json : call.argumentsJson;
  return { kind: "wait", hold: "client", rule: "", timeoutMs: verdict.timeoutMs, onTimeout: "deny", argumentsJson };
}

/** Who a decision made by the policy's timeout names as its maker. */
export const TIMED_OUT = "policy:timeout";

function skipCalls(host: RunHost, calls: readonly ToolCall[], reason: string): void {
  for (const call of calls) {
    host.emit({
      case: "toolExecutionStart",
      value: { toolCallId: call.id, toolName: call.name, argumentsJson: call.argumentsJson },
    });
    finishCall(host, call, { output: reason, isError: true }, true);
  }
}

function finishCall(host: RunHost, call: ToolCall, result: ToolResult, skipped: boolean): void {
  host.emit({
    case: "toolExecutionEnd",
    value: { toolCallId: call.id, toolName: call.name, result: result.output, isError: result.isError, skipped },
  });
  pushMessage(
    host,
    create(ChatMessageSchema, {
      id: newId(),
      role: Role.TOOL,
      toolCallId: call.id,
      toolName: call.name,
      text: result.output,
      isError: result.isError,
      images: result.images ?? [],
      time: timestampNow(),
    }),
  );
}

/** A call the model got wrong (unknown tool, bad JSON, arguments off the schema): it sees why and can correct. */
class ToolInputError extends Error {}

const ajv = new Ajv({ allErrors: true, strict: false, logger: false });
/**
 * Compiled validators by schema text. Some tools are made anew for every run (the memory tools
 * and delegate_task carry the session's scope), so keying by the tool object would compile
 * their schemas again each run (0.7 ms each), and ajv keeps every schema object it compiled.
 */
const validators = new Map<string, ValidateFunction>();

/** Why `argumentsJson` is not a valid call of `tool` (an edit's check); undefined when it is. */
export function argumentProblems(tool: Tool, argumentsJson: string): string | undefined {
  try {
    parseArguments(tool, { id: "", name: tool.name, argumentsJson } as ToolCall);
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}

/** The call's arguments, parsed and checked against the tool's schema. */
function parseArguments(tool: Tool, call: ToolCall): Record<string, unknown> {
  let args: unknown;
  try {
    args = call.argumentsJson.trim() === "" ? {} : JSON.parse(call.argumentsJson);
  } catch (err) {
    throw new ToolInputError(
      `Invalid JSON in the arguments of ${call.name}: ${(err as Error).message}. Received: ${call.argumentsJson.slice(0, 500)}`,
    );
  }
  if (typeof args !== "object" || args === null || Array.isArray(args))
    throw new ToolInputError(
      `The arguments of ${call.name} must be a JSON object. Received: ${call.argumentsJson.slice(0, 500)}`,
    );
  const key = JSON.stringify(tool.parameters);
  let validate = validators.get(key);
  if (!validate) {
    validate = ajv.compile(tool.parameters);
    validators.set(key, validate);
  }
  if (!validate(args)) {
    const problems = (validate.errors ?? []).map(
      (e) =>
        `${e.instancePath || "(arguments)"}: ${e.message}${e.params && "additionalProperty" in e.params ? ` (${String(e.params.additionalProperty)})` : ""}`,
    );
    throw new ToolInputError(
      `The arguments of ${call.name} do not match its schema:\n- ${problems.join("\n- ")}\nReceived: ${call.argumentsJson.slice(0, 500)}`,
    );
  }
  return args as Record<string, unknown>;
}

/** One call: validated, passed by before_tool_call, executed, amended by after_tool_call. */
async function runToolCall(turn: Turn, call: ToolCall): Promise<ToolResult> {
  const { host, deps, info } = turn;
  const tool = deps.tools.find((t) => t.name === call.name);
  host.emit({
    case: "toolExecutionStart",
    value: { toolCallId: call.id, toolName: call.name, argumentsJson: call.argumentsJson },
  });
  const span = tracer.startSpan(`execute_tool ${call.name}`, {
    kind: SpanKind.INTERNAL,
    attributes: {
      [GenAI.OPERATION_NAME]: "execute_tool",
      [GenAI.TOOL_NAME]: call.name,
      [GenAI.TOOL_CALL_ID]: call.id,
      [GenAI.TOOL_TYPE]: "function",
      ...(tool ? { [GenAI.TOOL_DESCRIPTION]: tool.description } : {}),
    },
  });
  let result: ToolResult;
  const started = performance.now();
  try {
    if (!tool)
      throw new ToolInputError(
        `Tool ${call.name} not found. Available tools: ${deps.tools.map((t) => t.name).join(", ") || "none"}.`,
      );
    let args = parseArguments(tool, call);
    let blocked: string | undefined;
    const gate = await deps.hooks.modify(
      "before_tool_call",
      { ...info, toolCallId: call.id, toolName: call.name, args },
      (p, r) => {
        if (r.block) {
          blocked = r.reason || "no reason given";
          return { payload: p, stop: true };
        }
        return { payload: r.args && typeof r.args === "object" ? { ...p, args: r.args } : p };
      },
      { failClosed: true },
    );
    // A guard that cannot answer fails closed: the call does not run.
    if (gate.closedBy) blocked = `a before_tool_call hook (${gate.closedBy.name}) failed: ${gate.closedBy.message}`;
    if (blocked !== undefined) {
      result = { output: `Tool execution was blocked: ${blocked}`, isError: true };
    } else {
      if (gate.payload.args !== args)
        args = parseArguments(tool, { ...call, argumentsJson: JSON.stringify(gate.payload.args) });
      result = await context.with(trace.setSpan(context.active(), span), () =>
        tool.execute(args, {
          sessionId: host.sessionId,
          agentId: deps.agentId,
          toolCallId: call.id,
          signal: host.signal,
          onUpdate: (chunk) =>
            host.emit({
              case: "toolExecutionUpdate",
              value: { toolCallId: call.id, toolName: call.name, output: chunk },
            }),
        }),
      );
      const amended = await deps.hooks.modify(
        "after_tool_call",
        { ...info, toolCallId: call.id, toolName: call.name, args, result },
        (p, r) => ({
          payload: {
            ...p,
            result: {
              output: typeof r.output === "string" ? r.output : p.result.output,
              isError: typeof r.isError === "boolean" ? r.isError : p.result.isError,
            },
          },
        }),
      );
      amended.failures.forEach(hookFailed(host));
      result = amended.payload.result;
    }
  } catch (err) {
    // Tools throw to report failure; the model sees the message and can correct itself.
    if (err instanceof ToolInputError) {
      report(host, "INVALID_TOOL_CALL", err.message.split("\n")[0]);
      result = { output: err.message, isError: true };
    } else result = { output: `Tool ${call.name} failed: ${(err as Error)?.message ?? String(err)}`, isError: true };
  }
  if (result.isError) span.setStatus({ code: SpanStatusCode.ERROR });
  span.end();
  // A name the model made up is not a label value: metrics keep one series per real tool.
  const seconds = secondsSince(started);
  instruments().toolDuration.record(seconds, {
    [GenAI.TOOL_NAME]: tool ? call.name : "unknown",
    "troupe.tool.outcome": result.isError ? "error" : "ok",
  });
  instruments().tenantToolSeconds.add(seconds, { tenant: deps.tenant });
  return result;
}
