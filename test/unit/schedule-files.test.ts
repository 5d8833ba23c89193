// Schedule files on real disk, in-process: named by the session's ref, written whole, read only
// under their own name, and an empty or torn one is skipped (reported), never a failed start.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { ScheduleSchema } from "../../services/shared/gen/troupe/v1/schedule_pb.js";
import { ScheduleBook } from "../../services/runner/schedules/schedules.js";
import { FileScheduleStore } from "../../services/runner/store/schedule-files.js";
import { InMemoryScheduleStore } from "../../services/runner/store/in-memory-store.js";
import { fileName } from "../../services/shared/session-ref.js";
import { scheduleTool } from "../../services/runner/tools/schedule-tool.js";

const acme = { tenant: "acme", principal: "alice", sessionId: "agent:x:main" };
const evil = { tenant: "evil", principal: "bob", sessionId: "agent_x_main" };
const every = (id: string, text: string) =>
  create(ScheduleSchema, { scheduleId: id, when: { case: "everySeconds", value: 60 }, text });

test("look-alike sessions have files of their own; a file speaks only under its own name", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-sched-"));
  try {
    const book = new ScheduleBook(new FileScheduleStore(dir));
    await book.put(acme, every("a", "acme's"), 20);
    await book.put(evil, every("e", "evil's"), 20);
    assert.deepEqual(
      book.list(await book.read(acme)).map((s) => s.text),
      ["acme's"],
    );
    assert.deepEqual(
      book.list(await book.read(evil)).map((s) => s.text),
      ["evil's"],
    );
    assert.equal(await book.remove(evil, "a"), false, "evil cannot delete acme's schedule by its id");
    // A file copied under another session's name (by hand, or by an old bug) is not that session's.
    const forged = path.join(dir, `${fileName(evil.tenant, evil.principal, "other")}.json`);
    await writeFile(
      forged,
      JSON.stringify({ ...acme, schedules: [{ scheduleId: "x", everySeconds: 60, text: "forged", createdMs: 1 }] }),
    );
    assert.equal(await book.read({ ...evil, sessionId: "other" }), undefined);
    assert.deepEqual(
      (await book.all()).map((f) => f.tenant).sort(),
      ["acme", "evil"],
      "the scheduler fires no file found under a name not its own",
    );
    assert.deepEqual(
      (await readdir(dir)).filter((n) => n.endsWith(".tmp")),
      [],
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("an empty or torn schedule file is reported and skipped; old names move to their ref's name", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-sched-"));
  try {
    await writeFile(path.join(dir, "empty.json"), "");
    await writeFile(path.join(dir, "torn.json"), '{"sessionId": "s", "tenant": "t", "princ');
    // A file of the old naming (the session id with ':' made '_').
    await writeFile(
      path.join(dir, "agent_x_main.json"),
      JSON.stringify({ ...acme, schedules: [{ scheduleId: "old", everySeconds: 60, text: "kept", createdMs: 1 }] }),
    );
    const damaged: string[] = [];
    const files = new FileScheduleStore(dir, (f) => damaged.push(path.basename(f)));
    await files.migrate();
    const book = new ScheduleBook(files);
    assert.deepEqual([...new Set(damaged)].sort(), ["empty.json", "torn.json"]);
    assert.deepEqual(
      book.list(await book.read(acme)).map((s) => s.text),
      ["kept"],
    );
    assert.deepEqual(
      (await book.all()).map((f) => f.sessionId),
      ["agent:x:main"],
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the schedule book over the in-memory store: checked, capped per session, removed, marked fired", async () => {
  const book = new ScheduleBook(new InMemoryScheduleStore(), 10);
  await assert.rejects(
    book.put(acme, create(ScheduleSchema, { when: { case: "everySeconds", value: 5 } }), 20),
    /every_seconds must be at least 10/,
  );
  await assert.rejects(
    book.put(acme, create(ScheduleSchema, { when: { case: "cron", value: "not cron" }, text: "x" }), 20),
    /cron:/,
  );
  for (let i = 0; i < 20; i++) await book.put(acme, every(`s${i}`, "x"), 20);
  await assert.rejects(book.put(acme, every("one-more", "x"), 20), /at most 20 schedules/);
  await book.put(acme, every("s0", "replaced"), 20);
  assert.equal(book.list(await book.read(acme)).find((s) => s.scheduleId === "s0")?.text, "replaced");
  assert.equal(await book.remove(acme, "s1"), true);
  assert.equal(await book.remove(acme, "s1"), false);
  await book.markFired(acme, "s0", 1_000_000);
  assert.equal(book.list(await book.read(acme)).find((s) => s.scheduleId === "s0")?.lastFireTime?.seconds, 1000n);
  assert.equal(await book.read(evil), undefined);
  for (let i = 0; i < 20; i++) await book.remove(acme, `s${i}`);
  assert.equal(await book.read(acme), undefined, "a session with no schedules has no record");
});

test("manage_schedule: the agent's own session's schedules, with the book's checks and the owner's quota", async () => {
  const book = new ScheduleBook(new InMemoryScheduleStore(), 10);
  let changes = 0;
  let max = 2;
  const tool = scheduleTool(acme, { book, changed: () => changes++, max: () => max, origin: async () => "in:abc" });
  const ctx = {
    sessionId: acme.sessionId,
    agentId: "a",
    toolCallId: "c",
    signal: new AbortController().signal,
    onUpdate() {},
  };
  const run = (args: Record<string, unknown>) => tool.execute(args, ctx);
  const made = await run({
    action: "create",
    schedule_id: "standup",
    cron: "0 9 * * mon-fri",
    time_zone: "Europe/Berlin",
    text: "standup",
  });
  assert.equal(made.isError, false, made.output);
  assert.match(
    made.output,
    /^scheduled standup: cron "0 9 \* \* mon-fri" Europe\/Berlin; next \d{4}-\d\d-\d\dT0[78]:00:00\.000Z; "standup"$/,
  );
  assert.match((await run({ action: "create", every_seconds: 30, text: "ping" })).output, /every 30 s/);
  // Each keeps the frame of the message its run answered: its replies' chat.
  assert.deepEqual(
    book.list(await book.read(acme)).map((s) => s.originFrameId),
    ["in:abc", "in:abc"],
  );
  // A caller of the API cannot say where a schedule came from.
  const viaApi = await book.put(
    acme,
    create(ScheduleSchema, {
      scheduleId: "api",
      when: { case: "everySeconds", value: 60 },
      originFrameId: "in:forged",
    }),
    10,
  );
  assert.equal(viaApi.originFrameId, "");
  await book.remove(acme, "api");
  const full = await run({ action: "create", every_seconds: 30, text: "third" });
  assert.deepEqual([full.isError, /at most 2 schedules \(quota schedulesPerSession\)/.test(full.output)], [true, true]);
  max = 3;
  const refusals: [Record<string, unknown>, RegExp][] = [
    [
      { action: "create", cron: "0 9 * * *", time_zone: "Nowhere/Land", text: "x" },
      /time_zone: "Nowhere\/Land" is not a time zone/,
    ],
    [{ action: "create", cron: "0 9 * * *", every_seconds: 60, text: "x" }, /either `cron` or `every_seconds`/],
    [{ action: "create", every_seconds: 3, text: "x" }, /every_seconds must be at least 10/],
    [{ action: "create", cron: "0 0 31 2 *", text: "x" }, /never fires/],
    [{ action: "delete" }, /`schedule_id` is required/],
    [{ action: "delete", schedule_id: "nope" }, /no schedule nope in this session/],
    [{ action: "explode" }, /`action` must be list, create or delete/],
  ];
  for (const [args, why] of refusals) {
    const r = await run(args);
    assert.equal(r.isError, true, JSON.stringify(args));
    assert.match(r.output, why, JSON.stringify(args));
  }
  // Another session's schedules are out of reach: the tool is bound to its session's ref.
  await book.put(evil, every("theirs", "evil's"), 20);
  assert.match((await run({ action: "delete", schedule_id: "theirs" })).output, /no schedule theirs/);
  const listed = await run({ action: "list" });
  const lines = listed.output.split("\n");
  assert.equal(lines.length, 2, listed.output);
  assert.ok(lines.some((l) => l.startsWith("standup: cron")) && lines.some((l) => /^s-[\w-]+: every 30 s/.test(l)));
  assert.equal((await run({ action: "delete", schedule_id: "standup" })).output, "deleted standup");
  assert.ok(changes >= 3);
});
