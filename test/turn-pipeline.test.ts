// The turn pipeline end to end (issue 6): context building, identity, compaction, retries and
// fallback, tools and hooks, through real processes and the scripted model; the operator files are
// in helpers/turn-stack.ts. Where a turn's input comes from (safety, sub-agents, triggers):
// turn-inputs.test.ts.
import { sessionLogPath } from "../services/runner/store/jsonl-session-store.js";
import { refOf } from "../services/shared/session-ref.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { ChatType } from "../services/shared/gen/troupe/v1/inbound_pb.js";
import { Role, StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { ChatSession } from "./helpers/session.js";
import { waitFor, type Stack } from "./helpers/stack.js";
import { type TurnStack, endOf, of, replyOf, startTurnStack } from "./helpers/turn-stack.js";

const { status: Status } = grpc;

let turns: TurnStack;
let stack: Stack;
let dataDir: string;
const open = (agentId?: string, sessionId?: string) => turns.open(agentId, sessionId);

before(async () => {
  turns = await startTurnStack();
  ({ stack, dataDir } = turns);
});
after(() => turns?.stop());

describe("the context builder", () => {
  test("sources in their order, identity last; workspace files nearest first; the profile made on first use", async () => {
    const s = await open("main", "ctx-override");
    const prompt = replyOf(await s.turn("!system"));
    s.close();
    const at = (needle: string) => {
      const i = prompt.indexOf(needle);
      assert.ok(i >= 0, `${needle} missing from:\n${prompt}`);
      return i;
    };
    const order = [
      "## Tools",
      "## Runtime",
      "## Workspace context",
      "## Skills",
      "## Instructions for this turn",
      "<identity>",
      "# Identity: Ada",
      "A careful research aide",
      "### SOUL.md",
      "### Your owner, who you are talking with (USER.md)",
    ].map(at);
    assert.deepEqual(
      [...order].sort((a, b) => a - b),
      order,
      "sections out of order",
    );
    assert.ok(prompt.trimEnd().endsWith("</identity>"), "the identity block is last");
    at("- exec:");
    at("Reference: the sandbox has busybox.");
    at("Agent: main");
    at("Session: ctx-override");
    at("Channel: grpc");
    // The session's own AGENTS.md wins over the one every agent shares.
    at("This session only: answer in French.");
    assert.ok(!prompt.includes("Every agent: be brief."));
    at("Ada's soul: curious and exact.");
    at("Skill: to check the weather");
    at("# Identity: Ada");
    at("A careful research aide");
    // before_prompt_build hooks ran highest priority first.
    assert.ok(at("INSTRUCTION-A") < at("INSTRUCTION-B"));
    const profile = await readFile(path.join(dataDir, "profiles", "main", "local", "dev", "USER.md"), "utf8");
    assert.match(profile, /^# About me/);
    at("# About me");
  });

  test("a prompt's instruction reaches its run's system prompt only; Troupe's own frame ids are refused", async () => {
    const s = await open();
    const from = s.events.length;
    s.send({ case: "prompt", value: { text: "!system", instruction: "Answer in exactly three words." } });
    await s.waitForPayload("agentEnd", 15_000, from);
    const withIt = replyOf(s.events.slice(from));
    const without = replyOf(await s.turn("!system"));
    assert.match(withIt, /## Instructions for this turn\n[\s\S]*Answer in exactly three words\./);
    assert.ok(!without.includes("Answer in exactly three words."));
    const history = (await stack.gateway.getHistory({ sessionId: s.opened!.sessionId })).messages;
    assert.ok(!history.some((m) => m.text.includes("Answer in exactly three words.") && m.role === Role.USER));
    s.send({ case: "prompt", value: { text: "x" } }, "trigger:heartbeat:fake:1");
    const status = await s.ended();
    assert.equal(status.code, Status.INVALID_ARGUMENT);
    assert.match(status.details, /reserved for Troupe/);
    const long = await open();
    long.send({ case: "prompt", value: { text: "x", instruction: "y".repeat(8001) } });
    assert.match((await long.ended()).details, /instruction must be at most 8000 characters/);
  });

  test("from 20 messages on, an identity reminder follows the identity block and stays", async () => {
    const s = await open();
    let prompt = "";
    for (let i = 0; i < 9; i++) await s.turn(`message ${i}`);
    prompt = replyOf(await s.turn("!system")); // messages 19 and 20
    assert.ok(!prompt.includes("Identity reminder"), "18 messages before this run: no reminder yet");
    prompt = replyOf(await s.turn("!system"));
    s.close();
    assert.match(prompt, /<\/identity>\s+# Identity reminder\n/);
    assert.ok(prompt.trimEnd().endsWith("communication style."));
  });

  test("an external sender from a channel meets the same agent, told who they are, and no profile", async () => {
    const adapter = await stack.gatewayAs("local", "dev", {}, { role: "adapter", channels: ["telegram"] });
    const res = await adapter.deliver({
      message: {
        idempotencyKey: "ext-1",
        context: { channel: "telegram", accountId: "bot", chatType: ChatType.DIRECT, sender: { id: "555" } },
        text: "!system",
      },
    });
    const history = await waitFor("the reply", async () => {
      const h = (await stack.gateway.getHistory({ sessionId: res.sessionId })).messages;
      return h.some((m) => m.role === Role.ASSISTANT) && h;
    });
    const prompt = history.find((m) => m.role === Role.ASSISTANT)!.text;
    assert.match(prompt, /who is not your owner/);
    assert.match(prompt, /Channel: telegram/);
    assert.ok(prompt.includes("# Identity: Ada") && prompt.includes("research aide"), prompt);
    assert.ok(!prompt.includes("USER.md") && !prompt.includes("# About me"), prompt);
    adapter.close();
  });

  test("a binary or oversized workspace file is reported by event, left out or cut, and the run goes on", async () => {
    const s = await open("badfiles");
    const events = await s.turn("!system");
    s.close();
    const problems = of(events, "error")
      .filter((e) => e.code === "CONTEXT_FILE")
      .map((e) => e.message);
    assert.ok(
      problems.some((m) => /AGENTS\.md is not a UTF-8 text file/.test(m)),
      problems.join("\n"),
    );
    assert.ok(
      problems.some((m) => /SOUL\.md has 10011 characters; only the first 4000 are used/.test(m)),
      problems.join("\n"),
    );
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED);
    const prompt = replyOf(events);
    assert.ok(prompt.includes("soul soul") && !prompt.includes("END-OF-SOUL"));
  });

  test("a broken agent.json is reported and the defaults serve the run", async () => {
    const s = await open("brokenconfig");
    const events = await s.turn("hello");
    s.close();
    assert.match(
      of(events, "error").find((e) => e.code === "AGENT_CONFIG")?.message ?? "",
      /agent\.json: not valid JSON/,
    );
    assert.equal(replyOf(events), "You said: hello");
  });
});

describe("compaction", () => {
  test("a 60-message conversation compacts, keeps its identity block last and every tool call paired", async () => {
    const s = await open("compact");
    const filler =
      "with enough words in it to fill the small window of this agent quickly, so that the older part must be summarised";
    let prompts = 0;
    const history = async () =>
      (await stack.gateway.getHistory({ sessionId: s.opened!.sessionId, pageSize: 1000 })).messages;
    while ((await history()).length < 58) {
      prompts++;
      // Every fourth prompt runs a command: an assistant call, its result, and the answer.
      const events = await s.turn(
        prompts % 4 === 0 ? `$ echo step ${prompts}` : `message ${prompts} ${filler}`,
        30_000,
      );
      // The scripted model refuses any request with a call separated from its result (as OpenAI does).
      assert.equal(endOf(events).stopReason, StopReason.COMPLETED, s.describe());
    }
    const last = await s.turn("!system");
    const all = s.events;
    s.close();
    assert.ok((await history()).length >= 60);
    const starts = of(all, "compactionStart");
    const ends = of(all, "compactionEnd");
    assert.ok(ends.length >= 2, `compactions: ${ends.length}`);
    assert.equal(starts.length, ends.length);
    assert.ok(starts.every((c) => c.reason === "threshold"));
    for (const c of ends) {
      assert.ok(!c.fallback, c.error);
      assert.match(
        c.summary,
        /^## Goal\n[\s\S]*## Constraints[\s\S]*## Progress[\s\S]*## Decisions[\s\S]*## Next steps/,
      );
      assert.ok(c.tokensAfter < c.tokensBefore, `${c.tokensAfter} < ${c.tokensBefore}`);
    }
    // The goal carried from the first summary into later ones (the earlier summary is merged).
    assert.match(ends.at(-1)!.summary, /## Goal\nmessage 1 /);
    // The cut never lands on a tool result: the first kept message is a user or assistant message.
    const messages = await history();
    for (const c of ends) {
      const kept = messages.find((m) => m.id === c.firstKeptMessageId);
      assert.ok(kept && kept.role !== Role.TOOL, "cut at a tool result");
    }
    // Every call in the full history still has its result (compaction changes the view, not the record).
    const calls = messages.flatMap((m) => m.toolCalls.map((c) => c.id));
    const results = new Set(messages.filter((m) => m.role === Role.TOOL).map((m) => m.toolCallId));
    assert.ok(calls.length >= 5 && calls.every((id) => results.has(id)));
    const prompt = replyOf(last);
    assert.match(prompt, /<\/identity>\s+# Identity reminder/);
    // Sections start "## " on a line of their own; the block's own "### " parts are inside it.
    assert.ok(prompt.lastIndexOf("\n## ") < prompt.indexOf("<identity>"), "a section after the identity block");
  });

  test("the summary is in the session log: after a runner restart the model still starts from it", async () => {
    const s = await open("tight");
    for (const text of ["first request: plan the garden", "second", "third"]) await s.turn(text);
    const events = await s.turn("!overflow 3");
    const sessionId = s.opened!.sessionId;
    s.close();
    const start = of(events, "compactionStart")[0];
    assert.equal(start?.reason, "overflow", s.describe());
    assert.equal(replyOf(events), "Fits in 2 messages.");
    const log = await readFile(sessionLogPath(dataDir, refOf(DEV_IDENTITY, sessionId)), "utf8");
    assert.match(log, /"compactionEnd"/);
    await stack.kill("runner", "SIGKILL");
    await stack.start("runner");
    const again = new ChatSession(stack.gateway);
    again.send({ case: "open", value: { sessionId, create: false } });
    await again.waitOpened(20_000);
    const first = replyOf(await again.turn("!first", 30_000));
    again.close();
    assert.match(first, /^The earlier part of this conversation was summarised/);
    assert.match(first, /first request: plan the garden/);
  });

  test("when the model cannot summarise, a summary made of what is known is used and the turn goes on", async () => {
    const s = await open("tight");
    await s.turn("!nosummary please keep this");
    await s.turn("second");
    const events = await s.turn("!overflow 2");
    s.close();
    const end = of(events, "compactionEnd")[0];
    assert.ok(end?.fallback, s.describe());
    assert.match(end.error, /500/);
    assert.match(end.summary, /## Goal\n!nosummary please keep this/);
    assert.match(end.summary, /earlier messages were folded/);
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED);
  });
});

describe("retries and fallback", () => {
  test("a retryable failure is retried with backoff, each retry an event, and the run completes", async () => {
    const s = await open();
    const events = await s.turn("!fail 503 times=2");
    s.close();
    const retries = of(events, "modelRetry");
    assert.deepEqual(
      retries.map((r) => [r.attempt, r.httpStatus]),
      [
        [1, 503],
        [2, 503],
      ],
    );
    assert.ok(retries[1].delayMs >= retries[0].delayMs * 1.1, `backoff grows: ${retries.map((r) => r.delayMs)}`);
    assert.equal(replyOf(events), "Recovered after 2 failures.");
    // The failed attempts left no assistant message behind.
    assert.equal(of(events, "messageStart").filter((m) => m.message?.role === Role.ASSISTANT).length, 1);
  });

  test("Retry-After is honoured; one past the policy's longest wait is not waited for", async () => {
    const s = await open();
    const started = Date.now();
    const events = await s.turn("!fail 429 times=1 retry-after=1");
    assert.ok(of(events, "modelRetry")[0].delayMs >= 1000);
    assert.ok(Date.now() - started >= 1000);
    assert.equal(replyOf(events), "Recovered after 1 failures.");
    const long = await s.turn("!fail 429 times=1 retry-after=100");
    s.close();
    assert.equal(of(long, "modelRetry").length, 0);
    assert.equal(endOf(long).stopReason, StopReason.ERROR);
  });

  test("no retry on other client errors, nor once output reached the client", async () => {
    const s = await open();
    const bad = await s.turn("!fail 400");
    // Paced, so the first tokens reach the client before the cut.
    const cut = await s.turn("!cut 3 rate=50");
    s.close();
    assert.equal(of(bad, "modelRetry").length, 0);
    assert.equal(endOf(bad).stopReason, StopReason.ERROR);
    assert.equal(of(cut, "modelRetry").length, 0);
    assert.equal(endOf(cut).stopReason, StopReason.ERROR);
  });

  test("the agent's fallback chain takes over when its model keeps failing", async () => {
    const s = await open("fallback");
    const events = await s.turn("!fail 503 model=primary");
    s.close();
    assert.deepEqual(
      of(events, "modelRetry").map((r) => r.model),
      ["primary"],
    );
    const fb = of(events, "modelFallback");
    assert.deepEqual(
      fb.map((f) => [f.fromModel, f.toModel]),
      [["primary", "backup"]],
    );
    assert.equal(replyOf(events), "Answered by backup.");
    assert.equal(of(events, "messageEnd").find((m) => m.message?.role === Role.ASSISTANT)?.message?.model, "backup");
  });

  test("an unknown finish reason is reported by event; the reply stands and the session goes on", async () => {
    const s = await open();
    const events = await s.turn("!finish content_weird");
    const next = await s.turn("still there?");
    s.close();
    assert.match(of(events, "error").find((e) => e.code === "MODEL_FINISH_REASON")?.message ?? "", /content_weird/);
    assert.equal(endOf(events).stopReason, StopReason.COMPLETED);
    assert.equal(replyOf(next), "You said: still there?");
  });
});

describe("tools and hooks", () => {
  test("calls of parallel tools run together; malformed JSON is an event and an error result", async () => {
    const s = await open();
    const events = await s.turn(
      '!call read_file {"path": "a.txt"} ;; read_file {"path": "b.txt"} ;; list_files {}',
      30_000,
    );
    const kinds = events
      .filter((e) => e.payload.case === "toolExecutionStart" || e.payload.case === "toolExecutionEnd")
      .map((e) => e.payload.case);
    assert.deepEqual(kinds, [
      "toolExecutionStart",
      "toolExecutionStart",
      "toolExecutionStart",
      "toolExecutionEnd",
      "toolExecutionEnd",
      "toolExecutionEnd",
    ]);
    const bad = await s.turn('!call exec {"command": "echo');
    s.close();
    assert.match(
      of(bad, "error").find((e) => e.code === "INVALID_TOOL_CALL")?.message ?? "",
      /Invalid JSON in the arguments of exec/,
    );
    assert.equal(endOf(bad).stopReason, StopReason.COMPLETED);
  });

  test("before_tool_call blocks with a reason, rewrites arguments, and fails closed when it hangs; after_tool_call amends", async () => {
    const s = await open();
    const results: { result: string; isError: boolean }[] = [];
    for (const call of [
      'exec {"command": "echo forbidden"}',
      'exec {"command": "rewrite-me"}',
      'list_files {"path": "hang"}',
      'exec {"command": "echo amend"}',
    ]) {
      const events = await s.turn(`!call ${call}`, 30_000);
      results.push(of(events, "toolExecutionEnd")[0]);
    }
    s.close();
    assert.deepEqual(
      [results[0].result, results[0].isError],
      ["Tool execution was blocked: no forbidden commands", true],
    );
    assert.match(results[1].result, /^rewritten/);
    assert.match(
      results[2].result,
      /^Tool execution was blocked: a before_tool_call hook \(guard\) failed: hook before_tool_call \(guard\) did not answer within 300 ms/,
    );
    assert.ok(results[2].isError);
    assert.ok(
      results[3].result.startsWith("amend") && results[3].result.endsWith("[amended by hook]"),
      results[3].result,
    );
  });

  test("a hook that throws or hangs is reported by event and the turn goes on; observers never hold it up", async () => {
    const s = await open();
    const thrown = await s.turn("hook-throw");
    const hung = await s.turn("hook-hang");
    const started = Date.now();
    const slow = await s.turn("slow-observer");
    const slowMs = Date.now() - started;
    s.close();
    assert.match(
      of(thrown, "error").find((e) => e.code === "HOOK_ERROR")?.message ?? "",
      /before_prompt_build .*deliberate hook failure/,
    );
    assert.equal(replyOf(thrown), "You said: hook-throw");
    assert.match(
      of(hung, "error").find((e) => e.code === "HOOK_ERROR")?.message ?? "",
      /hanger\) failed: .*did not answer within 300 ms/,
    );
    assert.equal(replyOf(hung), "You said: hook-hang");
    assert.equal(replyOf(slow), "You said: slow-observer");
    assert.ok(slowMs < 3000, `${slowMs} ms`);
    const trail = await readFile(path.join(dataDir, "hook-trail.log"), "utf8");
    assert.match(trail, /received hook-throw\n/);
    assert.match(trail, /end COMPLETED\n/);
  });
});
