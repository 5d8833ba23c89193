// The session actor's part for runs that wait (docs/approvals.md): the tool calls the open run
// holds for a person's decision or a client's result (tool-waits.ts, a fold over the run's
// events), the checks a decision or a result passes before it is recorded, taking it, the
// deadlines, and going on or ending when the wait is over. Also the client's tools: the session's
// and those of the prompt that started the open run. It starts and ends nothing itself: the host
// resumes or closes the run.
import type { RpcError } from "../../shared/errors.js";
import { failedPrecondition, invalidArgument, notFound } from "../../shared/errors.js";
import {
  type AgentEvent,
  type ChatMessage,
  type ClientFrame,
  StopReason,
  ToolVerdict,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { answerUnanswered, type EventPayload } from "../loop/run.js";
import { argumentProblems, TIMED_OUT } from "../loop/tool-calls.js";
import type { AuditRecord } from "../store/audit-log.js";
import { asTools, clientToolSpecs, mergeSpecs, shadowed, type ClientToolSpec } from "../tools/client-tools.js";
import type { Tool, ToolResult } from "../tools/tools.js";
import type { Resume } from "./session-rebuild.js";
import { type Phase, runGoing } from "./lifecycle.js";
import type { ClientToolRecord } from "./session-log.js";
import { type ToolWaits, VERDICT_NAME, foldWait, sameAnswer, sameDecision, type HeldCall } from "./tool-waits.js";

/** What the part needs of its session (actor-hosts.ts binds it). */
export interface HeldCallsHost {
  readonly sessionId: string;
  /** The session's tenant and principal (the principal decides when a decision names nobody). */
  readonly tenant: string;
  readonly principal: string;
  /** Where the session stands (lifecycle.ts): a wait goes on or ends only in `waiting`. Contract: never throws. */
  phase(): Phase;
  /** Steering waits in the mailbox. Contract: never throws. */
  steering(): boolean;
  /** Runs `fn` as run `turnId`, so what it emits belongs to that turn. Contract: never throws. */
  asRun(turnId: string, fn: () => void): void;
  /** Publishes an event. Contract: never throws. */
  emit(payload: EventPayload): void;
  /** Goes on with the waiting run now. Contract: never throws. */
  resume(resume: Resume): void;
  /** The session's conversation (a closed wait answers its held calls in it). */
  messages(): ChatMessage[];
  /** A waiting run was closed: what is queued may start. Contract: never throws. */
  closed(): void;
  /** Aborts the run going. Contract: never throws. */
  abortRun(why: string): void;
  /** The agent's own tools (for an edit's schema, and the names client tools may not take). */
  agentTools(): readonly Tool[];
  /** Writes an audit record. Contract: never throws. */
  audit(record: AuditRecord): void;
}

export class HeldCalls {
  /** What the open run holds, while it holds anything. */
  waits?: ToolWaits;
  private timer?: NodeJS.Timeout;
  /** The session's client tools (OpenSession.client_tools), kept in its log's settings. */
  private sessionTools: ClientToolSpec[] = [];
  /** The client tools of the prompt that started the open run (a resume offers them again). */
  private startTools?: ClientToolSpec[];

  constructor(private readonly host: HeldCallsHost) {}

  /** The open run stopped to wait (RunWaiting) and has not gone on. */
  get suspended(): boolean {
    return this.waits?.suspended === true;
  }

  /** The client tools the open run offers. */
  runTools(): ClientToolSpec[] {
    return mergeSpecs(this.sessionTools, this.startTools);
  }

  /** A new run starts with these prompts' client tools. */
  startRun(tools: readonly (ClientToolSpec[] | undefined)[]): void {
    this.startTools = mergeSpecs(...tools);
  }

  /** A rebuild from the log: the session's client tools, and the open run's. */
  restoreTools(session: ClientToolRecord[], run: ClientToolRecord[]): void {
    this.sessionTools = clientToolSpecs(session);
    this.startTools = run.length > 0 ? clientToolSpecs(run) : undefined;
  }

  /** A rebuild from the log: what the open run waits on. */
  restoreWaits(waits: ToolWaits): void {
    this.waits = waits;
    this.arm();
  }

  /** The session's client tools from now on; refused when one takes an agent tool's name. */
  setSessionTools(specs: ClientToolSpec[]): RpcError | undefined {
    const refused = this.shadowing(specs);
    if (!refused) this.sessionTools = specs;
    return refused;
  }

  /** A published event: what the wait is made of, and the end of the run. */
  published(event: AgentEvent): void {
    const kind = event.payload.case ?? "";
    const folded = foldWait(this.waits, event, event.turnId);
    if (folded) {
      this.waits = folded;
      if (kind !== "runWaiting" && kind !== "runResumed") this.arm();
    } else if (kind === "agentEnd") {
      this.startTools = undefined;
      this.waits = undefined;
      this.arm();
    }
  }

  /** The calls still waiting, for SessionInfo. */
  pending(): HeldCall[] {
    return this.waits?.pending() ?? [];
  }

  isHeld(id: string, kind: "approval" | "client"): boolean {
    return (kind === "client" ? this.waits?.clientCalls : this.waits?.held)?.has(id) === true;
  }

  decisionOf(id: string) {
    return this.waits?.decided.get(id);
  }

  clientResultOf(id: string): ToolResult | undefined {
    const a = this.waits?.answered.get(id);
    return a && { output: a.output, isError: a.isError };
  }

  /**
   * Why a frame cannot be taken ("duplicate": it repeats what was taken), or undefined. Checked
   * before the frame is recorded, so a refused decision, result or prompt changes nothing.
   */
  check(frame: ClientFrame): RpcError | "duplicate" | undefined {
    const k = frame.kind;
    if (k.case === "prompt") return this.shadowing(clientToolSpecs(k.value.clientTools));
    if (k.case === "clientToolResult") {
      const r = k.value;
      if (!this.waits?.clientCalls.has(r.toolCallId))
        return notFound(
          `no client tool call ${JSON.stringify(r.toolCallId)} waits for a result in session ${this.host.sessionId}`,
        );
      const taken = this.waits.answered.get(r.toolCallId);
      if (!taken) return undefined;
      return sameAnswer(taken, r)
        ? "duplicate"
        : failedPrecondition(`tool call ${r.toolCallId} was already answered; a result is taken once`);
    }
    if (k.case !== "toolDecision") return undefined;
    const d = k.value;
    const held = this.waits?.held.get(d.toolCallId);
    if (!held)
      return notFound(
        `no tool call ${JSON.stringify(d.toolCallId)} waits for a decision in session ${this.host.sessionId}`,
      );
    const taken = this.waits!.decided.get(d.toolCallId);
    if (taken)
      return sameDecision(taken, d)
        ? "duplicate"
        : failedPrecondition(
            `tool call ${d.toolCallId} was already ${VERDICT_NAME[taken.verdict]} by ${taken.decidedBy}; a decision is taken once`,
          );
    if (d.verdict !== ToolVerdict.EDIT) return undefined;
    const tool = [...this.host.agentTools(), ...asTools(this.runTools())].find((t) => t.name === held.toolName);
    const why = tool ? argumentProblems(tool, d.argumentsJson) : `tool ${held.toolName} is no longer offered`;
    return why ? invalidArgument(`the edited arguments of tool call ${d.toolCallId} are not valid: ${why}`) : undefined;
  }

  /** Takes a recorded decision or client result; the run goes on if that was all it waited for. */
  take(frame: ClientFrame): void {
    const k = frame.kind;
    const waits = this.waits;
    if (!waits) return;
    if (k.case === "clientToolResult") {
      const r = k.value;
      // Two different answers raced past the check: the first one recorded stands.
      if (!waits.clientCalls.has(r.toolCallId) || waits.answered.has(r.toolCallId)) return;
      this.emitInWait(waits, {
        case: "clientToolAnswered",
        value: { toolCallId: r.toolCallId, output: r.output, isError: r.isError, frameId: frame.frameId },
      });
    } else if (k.case === "toolDecision") {
      const d = k.value;
      const held = waits.held.get(d.toolCallId);
      if (!held || waits.decided.has(d.toolCallId)) return;
      const decidedBy = d.decidedBy || this.host.principal;
      const argumentsJson = d.verdict === ToolVerdict.EDIT ? d.argumentsJson : "";
      const value = { toolCallId: d.toolCallId, verdict: d.verdict, decidedBy, message: d.message, argumentsJson };
      this.emitInWait(waits, { case: "toolDecided", value: { ...value, frameId: frame.frameId } });
      this.audit(waits.turnId, held.toolName, { ...value, frameId: frame.frameId });
    } else return;
    this.goOnIfDue();
  }

  /** A run stopped to wait goes on when every call it holds is answered, or steering came for it. */
  goOnIfDue(): void {
    const waits = this.waits;
    if (!waits?.suspended || this.host.phase() !== "waiting") return;
    if (!waits.due && !this.host.steering()) return;
    this.host.resume({ turnId: waits.turnId, from: waits.from, interrupted: [], afterWait: true });
  }

  /** Ends a run stopped to wait: its held calls are answered with why, then agent_end. */
  endWait(reason: StopReason, why: string): void {
    const waits = this.waits;
    if (!waits?.suspended || this.host.phase() !== "waiting") return;
    this.host.asRun(waits.turnId, () => {
      answerUnanswered((p) => this.host.emit(p), this.host.messages(), `Not run: ${why}.`);
      const errorMessage = reason === StopReason.ABORTED ? "" : why;
      this.host.emit({ case: "agentEnd", value: { stopReason: reason, errorMessage } });
    });
    this.host.closed();
  }

  /** Stops the deadline's timer (the actor is closing or lost). */
  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Names the agent's tools among `specs`, as a refusal. */
  private shadowing(specs: readonly ClientToolSpec[]): RpcError | undefined {
    if (specs.length === 0) return undefined;
    const clash = shadowed(specs, this.host.agentTools());
    return clash.length > 0
      ? invalidArgument(`client tools may not take the names of the agent's own tools: ${clash.join(", ")}`)
      : undefined;
  }

  /** Publishes an event of the waiting run under its turn (no run is going while it waits). */
  private emitInWait(waits: ToolWaits, payload: EventPayload): void {
    if (runGoing(this.host.phase())) this.host.emit(payload);
    else this.host.asRun(waits.turnId, () => this.host.emit(payload));
  }

  private audit(
    turnId: string,
    toolName: string,
    d: {
      toolCallId: string;
      verdict: ToolVerdict;
      decidedBy: string;
      message: string;
      argumentsJson: string;
      frameId: string;
    },
  ): void {
    this.host.audit({
      action: "tool_decision",
      sessionId: this.host.sessionId,
      tenant: this.host.tenant,
      turnId,
      toolName,
      ...d,
      verdict: VERDICT_NAME[d.verdict],
    });
  }

  /** The timer for the earliest deadline of a call still waiting. */
  private arm(): void {
    this.stop();
    const next = this.waits?.nextDeadlineMs();
    if (next === undefined || !Number.isFinite(next)) return;
    this.timer = setTimeout(() => this.expire(), Math.min(Math.max(0, next - Date.now()), 2 ** 31 - 1));
    this.timer.unref();
  }

  /** Calls past their deadline: a client's is answered as failed; a decision is the policy's (reject, or abort the run). */
  private expire(): void {
    const waits = this.waits;
    if (!waits) return;
    const now = Date.now();
    for (const h of waits.pending()) {
      if (h.deadlineMs > now) continue;
      const { toolCallId, toolName } = h;
      const seconds = Math.round((h.deadlineMs - h.sinceMs) / 1000);
      if (h.kind === "client") {
        const output = `The client did not answer this call within ${seconds} s.`;
        this.emitInWait(waits, {
          case: "clientToolAnswered",
          value: { toolCallId, output, isError: true, frameId: "" },
        });
        continue;
      }
      if (h.onTimeout === "abort") {
        const why = `nobody decided on ${toolName} within ${seconds} s, so the approval policy aborted the run`;
        if (runGoing(this.host.phase())) this.host.abortRun(why);
        else this.endWait(StopReason.ABORTED, why);
        return;
      }
      const value = {
        toolCallId,
        verdict: ToolVerdict.REJECT,
        decidedBy: TIMED_OUT,
        message: `no decision came within ${seconds} s`,
        argumentsJson: "",
        frameId: "",
      };
      this.emitInWait(waits, { case: "toolDecided", value });
      this.audit(waits.turnId, toolName, value);
    }
    this.arm();
    this.goOnIfDue();
  }
}
