// SubscribeInbox through the live stack: one stream carries every session an adapter's Deliver
// calls made (and sessions it made later), each session's events in order with none missing; a
// cursor resumes exactly after the event it came with, across sessions that spoke while no
// stream was open; nobody else's sessions appear; a slow reader loses nothing; bad cursors are
// INVALID_ARGUMENT.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { SubscribeInboxResponse } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import type { AgentEvent } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { Status } from "../services/shared/errors.js";
import { startStack, waitFor, type Stack } from "./helpers/stack.js";

type Gateway = Awaited<ReturnType<Stack["gatewayAs"]>>;
let stack: Stack;
let dataDir: string;
let adapter: Gateway;
let n = 0;

before(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-inbox-"));
  await writeFile(path.join(dataDir, "routing.json"), JSON.stringify({ session: { dmScope: "per-channel-peer" } }));
  stack = await startStack({ dataDir, services: ["model-server", "router", "memory", "runner", "gateway"] });
  adapter = await stack.gatewayAs("local", "tg-bot", {}, { role: "adapter", channels: ["telegram"] });
});
after(async () => {
  adapter?.close();
  await stack?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

const say = (client: Gateway, sender: string, text: string) =>
  client.deliver({
    message: {
      idempotencyKey: `tg-${++n}`,
      context: { channel: "telegram", accountId: "bot", sender: { id: sender } },
      text,
    },
  });

/** An open inbox: what it has received, and a way to wait for more. */
function openInbox(client: Gateway, afterCursor = "") {
  const call = client.subscribeInbox({ afterCursor });
  const got: SubscribeInboxResponse[] = [];
  let failure: unknown;
  call.on("data", (r: SubscribeInboxResponse) => got.push(r));
  call.on("error", (e) => {
    if ((e as { code?: number }).code !== Status.CANCELLED) failure = e;
  });
  return {
    call,
    got,
    get failure() {
      return failure;
    },
    /** Waits until `ok` holds for what arrived. */
    until: (what: string, ok: (events: AgentEvent[]) => boolean, ms = 30_000) =>
      waitFor(
        what,
        async () => {
          if (failure) throw failure;
          return ok(got.map((r) => r.event!));
        },
        ms,
      ),
  };
}

const ends = (events: AgentEvent[], sessionId: string) =>
  events.filter((e) => e.sessionId === sessionId && e.payload.case === "agentEnd").length;
const assistantTexts = (events: AgentEvent[], sessionId: string) =>
  events.flatMap((e) =>
    e.sessionId === sessionId && e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT
      ? [e.payload.value.message.text]
      : [],
  );
/** Each session's seqs as received: in order, none twice. */
function seqsBySession(events: AgentEvent[]): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const e of events) {
    const list = out.get(e.sessionId) ?? [];
    list.push(Number(e.seq));
    out.set(e.sessionId, list);
  }
  return out;
}
const contiguous = (seqs: number[], from: number) => seqs.every((s, i) => s === from + i);

test("one stream carries every session's events, in order and complete, and nobody else's", async () => {
  const inbox = openInbox(adapter);
  const stranger = await stack.gatewayAs("local", "someone-else");
  const otherTenant = await stack.gatewayAs("other", "tg-bot", {}, { role: "adapter", channels: ["telegram"] });
  try {
    const a = await say(adapter, "701", "hello from a");
    const b = await say(adapter, "702", "hello from b");
    const foreign = await say(otherTenant, "701", "another tenant's chat");
    const mine = await stranger.createSession({});
    await stranger.sendMessage({ sessionId: mine.session!.sessionId, frameId: "s1", text: "not the adapter's" });
    await inbox.until("both sessions answered", (ev) => ends(ev, a.sessionId) === 1 && ends(ev, b.sessionId) === 1);
    const events = inbox.got.map((r) => r.event!);
    assert.deepEqual(assistantTexts(events, a.sessionId), ["You said: hello from a"]);
    assert.deepEqual(assistantTexts(events, b.sessionId), ["You said: hello from b"]);
    for (const [id, seqs] of seqsBySession(events)) assert.ok(contiguous(seqs, 1), `${id}: ${seqs}`);
    // Wait long enough for a poll to have listed everything: still only the adapter's two sessions.
    await new Promise((r) => setTimeout(r, 2500));
    const ids = new Set(inbox.got.map((r) => r.event!.sessionId));
    assert.deepEqual([...ids].sort(), [a.sessionId, b.sessionId].sort());
    assert.ok(!ids.has(mine.session!.sessionId));
    // The other tenant's session may bear the same name (names are per owner): its words must not appear.
    await waitFor(
      "the other tenant's answer",
      async () => (await otherTenant.getHistory({ sessionId: foreign.sessionId })).messages.length === 2,
    );
    const said = inbox.got.flatMap((r) =>
      r.event!.payload.case === "messageEnd" ? [r.event!.payload.value.message?.text] : [],
    );
    assert.ok(!said.some((t) => t?.includes("another tenant")), said.join(" | "));
  } finally {
    inbox.call.cancel();
    stranger.close();
    otherTenant.close();
  }
});

test("a session the adapter makes without Deliver is found by the next listing", async () => {
  const inbox = openInbox(adapter);
  try {
    const made = await adapter.createSession({});
    const id = made.session!.sessionId;
    await adapter.sendMessage({ sessionId: id, frameId: "m1", text: "found later" });
    await inbox.until("the made session's answer", (ev) => ends(ev, id) === 1, 15_000);
    assert.deepEqual(
      assistantTexts(
        inbox.got.map((r) => r.event!),
        id,
      ),
      ["You said: found later"],
    );
  } finally {
    inbox.call.cancel();
  }
});

test("a cursor resumes right after its event: nothing lost, nothing twice, across quiet time", async () => {
  const first = openInbox(adapter);
  const c = await say(adapter, "703", "one");
  await first.until("the first answer", (ev) => ends(ev, c.sessionId) === 1);
  // Stop in the middle of what arrived: keep the cursor of an event of the run.
  const cut = first.got.findIndex(
    (r) => r.event!.sessionId === c.sessionId && r.event!.payload.case === "messageStart",
  );
  assert.ok(cut > 0);
  const kept = first.got[cut]!;
  first.call.cancel();
  const seenUpTo = new Map<string, number>();
  for (const r of first.got.slice(0, cut + 1))
    seenUpTo.set(r.event!.sessionId, Math.max(seenUpTo.get(r.event!.sessionId) ?? 0, Number(r.event!.seq)));

  // While no stream is open: the same chat speaks again, and a new chat begins.
  await say(adapter, "703", "two");
  const d = await say(adapter, "704", "a new chat");
  await waitFor("both answered", async () => {
    const h1 = (await adapter.getHistory({ sessionId: c.sessionId })).messages;
    const h2 = (await adapter.getHistory({ sessionId: d.sessionId })).messages;
    return h1.length === 4 && h2.length === 2;
  });

  const second = openInbox(adapter, kept.cursor);
  await second.until(
    "c's second answer and d's answer",
    (ev) => ends(ev, c.sessionId) >= 1 && ends(ev, d.sessionId) === 1,
  );
  await new Promise((r) => setTimeout(r, 500));
  second.call.cancel();
  const events = second.got.map((r) => r.event!);
  const bySession = seqsBySession(events);
  for (const [id, seqs] of bySession) {
    const from = (seenUpTo.get(id) ?? 0) + 1;
    assert.ok(contiguous(seqs, from), `${id} resumes at ${from}: got ${seqs}`);
  }
  assert.equal(bySession.get(c.sessionId)?.[0], seenUpTo.get(c.sessionId)! + 1);
  assert.deepEqual(assistantTexts(events, c.sessionId), ["You said: one", "You said: two"]);
  assert.deepEqual(assistantTexts(events, d.sessionId), ["You said: a new chat"]);
});

test("a reader that stops reading loses nothing when it reads again", async () => {
  const inbox = openInbox(adapter);
  // 1.6 MB in all, more than the inbox stream's 1 MiB receive window: the gateway must hold its
  // runner streams back. Each run's 400 KB fits its own runner stream's window, so runs end.
  inbox.call.pause();
  const runs = await Promise.all(["705", "706", "707", "708"].map((sender) => say(adapter, sender, "!tokens 60000")));
  await waitFor("every long answer is written", async () => {
    for (const s of runs) if ((await adapter.getHistory({ sessionId: s.sessionId })).messages.length < 2) return false;
    return true;
  });
  inbox.call.resume();
  await inbox.until("every run ends", (ev) => runs.every((s) => ends(ev, s.sessionId) === 1));
  inbox.call.cancel();
  const events = inbox.got.map((r) => r.event!);
  for (const s of runs) {
    const text = assistantTexts(events, s.sessionId)[0]!;
    assert.equal(text.trim().split(" ").length, 60000);
    const seqs = seqsBySession(events).get(s.sessionId)!;
    assert.ok(contiguous(seqs, 1), `${s.sessionId} in order, none missing`);
  }
});

test("a cursor this service did not issue is INVALID_ARGUMENT; a stranger's session in one stays hidden", async () => {
  for (const bad of ["garbage", "i1.!!", `i1.${Buffer.from('{"w":-1,"s":[]}').toString("base64url")}`]) {
    const inbox = openInbox(adapter, bad);
    await waitFor(`refusal of ${bad}`, async () => inbox.failure !== undefined);
    assert.equal((inbox.failure as { code: number }).code, Status.INVALID_ARGUMENT);
  }
  const stranger = await stack.gatewayAs("local", "someone-else");
  try {
    const theirs = (await stranger.createSession({})).session!.sessionId;
    await stranger.sendMessage({ sessionId: theirs, frameId: "x1", text: "private" });
    const forged = `i1.${Buffer.from(JSON.stringify({ w: 0, s: [[theirs, 0]] })).toString("base64url")}`;
    const inbox = openInbox(adapter, forged);
    await new Promise((r) => setTimeout(r, 3000));
    inbox.call.cancel();
    assert.equal(inbox.failure, undefined);
    assert.ok(!inbox.got.some((r) => r.event!.sessionId === theirs));
  } finally {
    stranger.close();
  }
});
