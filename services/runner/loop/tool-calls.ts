// Tool calls: arguments parsed and checked against each tool's schema, before/after hooks,
// parallel groups where the tools allow, steering looked for before each group, results paired
// with their calls (skipped ones too), and the run's quota of tool calls.
// tools, prompt, hooks); the loop itself holds no state between runs.
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { Ajv, type ValidateFunction } from "ajv";
import {
  ChatMessageSchema,
  Role,
  StopReason,
  type ChatMessage,
  type ToolCall,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { newId } from "../../shared/ids.js";
import { instruments, secondsSince } from "../../shared/process/metrics.js";
import { GenAI, tracer } from "../../shared/process/telemetry.js";
import type { Tool, ToolResult } from "../tools/tools.js";
import { hookFailed, pushMessage, report, type QueuedMessage, type RunHost, type Turn } from "./run.js";

const SKIPPED_BY_STEER = "Skipped due to queued user message.";
const SKIPPED_BY_ABORT = "Not run: the run was aborted.";

/**
 * Runs the batch in the model's order. Consecutive calls of tools that declare themselves
 * parallel run together; any other call runs alone. Before each group the steering queue is read:
 * if a message is waiting, this group and the rest are skipped with paired results, and the
 * steering messages are returned to be injected before the next model call. A call that is
 * already running always finishes (or is cancelled by an abort).
 */
export async function executeToolCalls(turn: Turn, assistant: ChatMessage): Promise<QueuedMessage[]> {
  const { host, deps } = turn;
  const calls = assistant.toolCalls;
  const parallel = (c: ToolCall) => deps.tools.find((t) => t.name === c.name)?.parallel === true;
  for (let i = 0; i < calls.length; ) {
    if (host.signal.aborted) {
      skipCalls(host, calls.slice(i), SKIPPED_BY_ABORT);
      return [];
    }
    const steering = host.takeSteering();
    if (steering.length > 0) {
      const skipped = calls.slice(i);
      host.emit({
        case: "toolCallsSkipped",
        value: { frameId: steering[0].frameId, toolCallIds: skipped.map((c) => c.id) },
      });
      skipCalls(host, skipped, SKIPPED_BY_STEER);
      return steering;
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
      return host.takeSteering();
    }
    let end = i + 1;
    if (parallel(calls[i])) while (end < calls.length && parallel(calls[end]) && end - i < turn.budget.toolCalls) end++;
    const group = calls.slice(i, end);
    turn.budget.toolCalls -= group.length;
    const results = await Promise.all(
      group.map(async (call) => {
        const result = await runToolCall(turn, call);
        return deps.screenToolResult ? deps.screenToolResult(call, result) : result;
      }),
    );
    for (const [k, call] of group.entries()) finishCall(host, call, results[k], false);
    i = end;
  }
  return host.takeSteering();
}

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
      time: timestampNow(),
    }),
  );
}

/** A call the model got wrong (unknown tool, bad JSON, arguments off the schema): it sees why and can correct. */
class ToolInputError extends Error {}

const ajv = new Ajv({ allErrors: true, strict: false });
/**
 * Compiled validators by schema text. Some tools are made anew for every run (the memory tools
 * and delegate_task carry the session's scope), so keying by the tool object would compile
 * their schemas again each run (0.7 ms each), and ajv keeps every schema object it compiled.
 */
const validators = new Map<string, ValidateFunction>();

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
