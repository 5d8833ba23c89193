// `troupe chat`: a terminal client of the gateway's Chat stream.
//   troupe chat "MESSAGE"   one turn, then exit (0 if the turn completed)
//   ... | troupe chat       what is piped in is one message: one turn, then exit
//   --json                  every event as a JSON line on stdout; -c: the session used last
//   --instruction TEXT      for each turn's system prompt only; --queue-mode: the session's
//                           default, and how a line typed during a turn is queued
//   --model PROVIDER/MODEL  the session's model from now on (one its agent allows)
//   troupe chat             interactive (a terminal, or -i): a line typed while the agent works
//                           is sent as steering; Ctrl-C aborts the running turn, a second exits;
//                           a tool call held for approval is answered with y, n [reason] or
//                           e {json} (decisions.ts)
//   A connection lost mid-session (a runner or gateway restarting) is made again, and the
//   session's events go on from the last one seen (chat-stream.ts).
import readline from "node:readline";
import { randomBytes } from "node:crypto";
import { loadConfig } from "../shared/config/config.js";
import { statusName } from "../shared/errors.js";
import { toJson } from "@bufbuild/protobuf";
import {
  AgentEventSchema,
  QueueMode,
  Role,
  StopReason,
  type AgentEvent,
  type ToolApprovalRequested,
} from "../shared/gen/troupe/v1/session_pb.js";
import { askLine, parseDecision } from "./decisions.js";
import { StreamedText } from "../shared/streamed-text.js";
import { ChatStream } from "./chat-stream.js";
import { CLIENT_FLAGS, gatewayClient, listAllSessions } from "./gateway-client.js";

const dim = (s: string) => (process.stderr.isTTY ? `\x1b[2m${s}\x1b[0m` : s);
const red = (s: string) => (process.stderr.isTTY ? `\x1b[31m${s}\x1b[0m` : s);

export async function chatCommand(args: string[]): Promise<number> {
  const cfg = loadConfig(args, undefined, {
    session: { type: "string" },
    agent: { type: "string" },
    json: { type: "boolean" },
    continue: { type: "boolean", short: "c" },
    instruction: { type: "string" },
    "queue-mode": { type: "string" },
    model: { type: "string" },
    interactive: { type: "boolean", short: "i" },
    ...CLIENT_FLAGS,
  });
  const modeName = cfg.flags["queue-mode"] === undefined ? undefined : String(cfg.flags["queue-mode"]);
  const queueMode = modeName === undefined ? QueueMode.UNSPECIFIED : QUEUE_MODES[modeName];
  if (queueMode === undefined) {
    process.stderr.write(
      `troupe chat: --queue-mode must be one of ${Object.keys(QUEUE_MODES).join(", ")}, not "${modeName}"\n`,
    );
    return 2;
  }
  const instruction = String(cfg.flags.instruction ?? "");
  let message = cfg.rest.join(" ").trim();
  // Piped in (not a terminal, and not -i): the whole of it is one message, not a line each.
  if (!message && !process.stdin.isTTY && !cfg.flags.interactive) {
    message = (await readAll(process.stdin)).trim();
    if (!message) {
      process.stderr.write("troupe chat: nothing came on stdin (give a MESSAGE, or -i to type lines)\n");
      return 2;
    }
  }
  const client = await gatewayClient(cfg);
  // -c: the session the caller used last (ListSessions, by last update).
  let sessionId = String(cfg.flags.session ?? "");
  if (cfg.flags.continue && !sessionId) {
    const sessions = await listAllSessions(client).catch(() => []);
    const latest = sessions.sort((a, b) => Number((b.updateTime?.seconds ?? 0n) - (a.updateTime?.seconds ?? 0n)))[0];
    if (!latest) process.stderr.write(dim("[no earlier session: starting a new one]\n"));
    sessionId = latest?.sessionId ?? "";
  }
  const prefix = randomBytes(4).toString("hex");
  let n = 0;
  const frameId = () => `cli-${prefix}-${++n}`;
  let running = false;
  let lastStop = StopReason.UNSPECIFIED;
  let interrupts = 0;
  // What was printed of each assistant message, so that a replay's gap leaves no hole in one.
  const printed = new StreamedText();
  /** Held calls not yet decided, oldest first: a typed y / n / e answers the first. */
  const held: ToolApprovalRequested[] = [];
  let openedAs = sessionId;

  const render = (ev: AgentEvent) => {
    const p = ev.payload;
    switch (p.case) {
      case "runResumed":
        // What streamed of a message the restart cut off stays as it is, on a line of its own.
        if (printed.resumed().some((shown) => shown !== "")) process.stdout.write("\n");
        process.stderr.write(
          dim(p.value.afterWait ? "\n[the run goes on]\n" : "\n[the run goes on after a runner restart]\n"),
        );
        break;
      case "toolApprovalRequested":
        process.stderr.write(`\n${askLine(p.value.toolName, p.value.argumentsJson, p.value.rule)}\n`);
        break;
      case "toolDecided":
        process.stderr.write(
          dim(`[${p.value.toolCallId}: ${DECIDED[p.value.verdict] ?? "decided"} by ${p.value.decidedBy}]\n`),
        );
        break;
      case "runWaiting":
        if (message)
          process.stderr.write(
            dim(
              `[the run waits for a decision: troupe sessions decide ${openedAs} ${p.value.toolCallIds[0]} approve|reject|edit]\n`,
            ),
          );
        break;
      case "gap":
        printed.gap(ev.seq);
        process.stderr.write(
          dim("\n[streamed output from while the connection was down is not kept; complete messages follow]\n"),
        );
        break;
      case "messageStart":
        if (p.value.message?.role === Role.ASSISTANT) printed.start(p.value.message.id, ev.seq);
        break;
      case "messageUpdate":
        if (p.value.delta.case === "text") process.stdout.write(printed.delta(p.value.messageId, p.value.delta.value));
        else if (p.value.delta.case === "thinking") process.stderr.write(dim(p.value.delta.value));
        break;
      case "messageEnd": {
        const m = p.value.message;
        if (m?.role !== Role.ASSISTANT) break;
        process.stdout.write(printed.end(m.id, m.text));
        break;
      }
      case "toolExecutionStart":
        process.stderr.write(dim(`\n[tool ${p.value.toolName}] ${p.value.argumentsJson}\n`));
        break;
      case "toolExecutionUpdate":
        process.stderr.write(dim(p.value.output));
        break;
      case "toolExecutionEnd":
        process.stderr.write(
          dim(
            p.value.skipped
              ? `[skipped ${p.value.toolName}: ${p.value.result}]\n`
              : `[${p.value.toolName} ${p.value.isError ? "failed" : "done"}]\n`,
          ),
        );
        break;
      case "toolCallsSkipped":
        process.stderr.write(dim(`[steering: skipped ${p.value.toolCallIds.length} tool call(s)]\n`));
        break;
      // What would otherwise look like a hang: a retry's wait, a switch of model, a compaction.
      case "modelRetry":
        process.stderr.write(
          dim(
            `\n[${p.value.model}: ${p.value.reason}; retry ${p.value.attempt} in ${(p.value.delayMs / 1000).toFixed(1)} s]\n`,
          ),
        );
        break;
      case "modelFallback":
        process.stderr.write(dim(`\n[${p.value.fromModel} failed (${p.value.reason}); now ${p.value.toModel}]\n`));
        break;
      case "compactionStart":
        process.stderr.write(dim(`\n[compacting the conversation: ${p.value.tokensBefore} tokens]\n`));
        break;
      case "compactionEnd":
        process.stderr.write(
          dim(
            `[compacted ${p.value.messagesSummarized} messages: ${p.value.tokensBefore} -> ${p.value.tokensAfter} tokens]\n`,
          ),
        );
        break;
      case "messageBlocked":
        process.stderr.write(red(`\n[message blocked by ${p.value.check} (${p.value.level}): ${p.value.reason}]\n`));
        break;
      case "error":
        process.stderr.write(red(`\n[error ${p.value.code}] ${p.value.message}\n`));
        break;
      case "agentEnd":
        process.stdout.write("\n");
        if (p.value.stopReason !== StopReason.COMPLETED)
          process.stderr.write(
            dim(
              `[${StopReason[p.value.stopReason].toLowerCase()}${p.value.errorMessage ? `: ${p.value.errorMessage}` : ""}]\n`,
            ),
          );
        break;
    }
  };

  const stream = new ChatStream(client, {
    open: { sessionId, agentId: String(cfg.flags.agent ?? ""), queueMode, model: String(cfg.flags.model ?? "") },
    onOpened: (id, again) => {
      openedAs = id;
      process.stderr.write(again ? dim(`[reconnected to session ${id}]\n`) : dim(`session ${id}\n`));
    },
    onLost: (err) =>
      process.stderr.write(
        dim(`\n[connection lost (${statusName(err.code ?? 2)}: ${err.details ?? err.message}); reconnecting]\n`),
      ),
    onEvent: (ev) => {
      // --json: every event as a line of the API's JSON mapping, for scripts (pi's --mode json).
      if (cfg.flags.json) process.stdout.write(`${JSON.stringify(toJson(AgentEventSchema, ev))}\n`);
      else render(ev);
      // Whether a run is going (a typed line steers it) and how the last one ended (the exit code).
      const p = ev.payload;
      if (p.case === "agentStart" || p.case === "runResumed") running = true;
      if (p.case === "agentEnd") [running, lastStop] = [false, p.value.stopReason];
      if (p.case === "toolApprovalRequested" && !held.some((h) => h.toolCallId === p.value.toolCallId))
        held.push(p.value);
      if (p.case === "toolDecided") {
        const at = held.findIndex((h) => h.toolCallId === p.value.toolCallId);
        if (at >= 0) held.splice(at, 1);
      }
      if (p.case === "agentEnd") held.length = 0;
    },
  });
  const ended = stream.ended.then((err) => {
    if (!err) return lastStop === StopReason.COMPLETED ? 0 : 1;
    if (err.code === 1) return lastStop === StopReason.COMPLETED ? 0 : 130; // cancelled by us
    process.stderr.write(red(`troupe chat: ${statusName(err.code ?? 2)}: ${err.details ?? String(err)}\n`));
    if (err.code === 14)
      process.stderr.write(
        `Is Troupe running? Start it with \`make run\` (gateway expected at ${cfg.addr.gateway}).\n`,
      );
    return 1;
  });

  if (message) {
    stream.send({ frameId: frameId(), kind: { case: "prompt", value: { text: message, instruction } } });
    stream.end(); // the stream ends once the session has nothing left to do
    process.on("SIGINT", () => {
      if (interrupts++ === 0 && running)
        stream.send({ frameId: frameId(), kind: { case: "abort", value: { reason: "Ctrl-C" } } });
      else stream.cancel();
    });
    const code = await ended;
    client.close();
    return code;
  }

  const rl = readline.createInterface({ input: process.stdin, output: process.stderr, terminal: process.stdin.isTTY });
  rl.on("line", (line) => {
    const text = line.trim();
    if (!text) return;
    // A held call waits: y / n / e answer it; anything else is a message as usual (steering ends the wait).
    const decided = held.length > 0 ? parseDecision(text) : undefined;
    if (decided && "error" in decided) {
      process.stderr.write(red(`[${decided.error}]\n`));
      return;
    }
    if (decided) {
      stream.send({
        frameId: frameId(),
        kind: { case: "toolDecision", value: { toolCallId: held[0].toolCallId, ...decided } },
      });
      return;
    }
    // While the agent works, what you type corrects it (or queues as --queue-mode says);
    // otherwise it starts a new turn.
    const kind =
      running && queueMode === QueueMode.UNSPECIFIED
        ? { case: "steer" as const, value: { text } }
        : { case: "prompt" as const, value: { text, instruction, queueMode } };
    stream.send({ frameId: frameId(), kind });
  });
  rl.on("SIGINT", () => {
    if (running && interrupts === 0) {
      interrupts++;
      stream.send({ frameId: frameId(), kind: { case: "abort", value: { reason: "Ctrl-C" } } });
      process.stderr.write(dim("\n[abort sent; Ctrl-C again to exit]\n"));
      setTimeout(() => (interrupts = 0), 3000).unref();
      return;
    }
    rl.close();
    stream.cancel();
  });
  rl.on("close", () => stream.end());
  const code = await ended;
  rl.close();
  client.close();
  return code;
}

const DECIDED: Record<number, string> = { 1: "approved", 2: "rejected", 3: "edited" };

const QUEUE_MODES: Record<string, QueueMode> = {
  steer: QueueMode.STEER,
  followup: QueueMode.FOLLOWUP,
  collect: QueueMode.COLLECT,
  interrupt: QueueMode.INTERRUPT,
  reject: QueueMode.REJECT,
};

async function readAll(input: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of input) chunks.push(Buffer.from(chunk as Buffer));
  return Buffer.concat(chunks).toString("utf8");
}
