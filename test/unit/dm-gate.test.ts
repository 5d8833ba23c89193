// Who may write in private (adapter/dm-gate.ts, adapter/pairing-book.ts), in-process over real
// files: each policy, a code told once and good for an hour, the operator's requests carried out
// by the one writer of the book, a cap on strangers waiting.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { mkdir, readdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { DmGate, type DmPolicy } from "../../services/adapter/dm-gate.js";
import {
  CODE_TTL_MS,
  MAX_PENDING,
  PairingBook,
  pairingFiles,
  readBook,
  requestFileName,
} from "../../services/adapter/pairing-book.js";
import { createLogger } from "../../services/shared/process/log.js";
import { tempDir } from "../helpers/tempdir.js";

const logger = createLogger("test", "error");

async function gate(t: TestContext, policy: DmPolicy, allowFrom: string[] = []) {
  const stateFile = path.join(await tempDir(t, "troupe-dm-"), "adapters", "telegram.json");
  const told: { to: string; text: string }[] = [];
  const g = await DmGate.start({
    policy,
    allowFrom: new Set(allowFrom),
    stateFile,
    tell: async (to, text) => void told.push({ to: to.chat_id!, text }),
    logger,
  });
  t.after(() => g.close());
  return { g, told, stateFile };
}

test("open lets anyone in; allowlist only its ids, silently", async (t) => {
  const open = await gate(t, "open");
  assert.equal(await open.g.admit({ id: "1", name: "a" }, { chat_id: "1" }), true);
  const list = await gate(t, "allowlist", ["7"]);
  assert.equal(await list.g.admit({ id: "7", name: "k" }, { chat_id: "7" }), true);
  assert.equal(await list.g.admit({ id: "8", name: "s" }, { chat_id: "8" }), false);
  assert.deepEqual(list.told, []);
});

test("pairing: a stranger is told a code once; approved, let in and told; revoked, a stranger again", async (t) => {
  const { g, told, stateFile } = await gate(t, "pairing", ["7"]);
  assert.equal(await g.admit({ id: "7", name: "known" }, { chat_id: "7" }), true, "allowFrom needs no code");
  assert.equal(await g.admit({ id: "9", name: "Stranger" }, { chat_id: "c9" }), false);
  assert.equal(await g.admit({ id: "9", name: "Stranger" }, { chat_id: "c9" }), false);
  assert.equal(told.length, 1, "told once");
  const code = /pairing code is ([A-Z2-9]{8})/.exec(told[0]!.text)![1]!;
  const files = pairingFiles(stateFile);
  assert.equal((await readBook(files.book)).pending[0]!.code, code);
  // A request for a code nobody holds is dropped; the right one lets the stranger in.
  await mkdir(files.requests, { recursive: true });
  await writeFile(path.join(files.requests, requestFileName({ verb: "approve", code: "ABCDEFGH" })), "");
  await writeFile(path.join(files.requests, requestFileName({ verb: "approve", code })), "");
  await waitUntil(async () => (await readdir(files.requests)).length === 0);
  assert.equal(await g.admit({ id: "9", name: "Stranger" }, { chat_id: "c9" }), true);
  assert.deepEqual(told.at(-1), { to: "c9", text: "You are let in: write again and the agent will answer." });
  assert.deepEqual(
    (await readBook(files.book)).allowed.map((a) => a.senderId),
    ["9"],
  );
  await writeFile(path.join(files.requests, requestFileName({ verb: "revoke", senderId: "9" })), "");
  await waitUntil(async () => (await readBook(files.book)).allowed.length === 0);
  assert.equal(await g.admit({ id: "9", name: "Stranger" }, { chat_id: "c9" }), false);
});

test("a code expires after an hour, and at most MAX_PENDING strangers wait", async (t) => {
  const stateFile = path.join(await tempDir(t, "troupe-dm-"), "a.json");
  const book = await PairingBook.open(stateFile);
  const first = await book.codeFor("s", "S", {}, 0);
  assert.equal(first?.fresh, true);
  assert.equal((await book.codeFor("s", "S", {}, CODE_TTL_MS - 1))?.code, first?.code);
  const later = await book.codeFor("s", "S", {}, CODE_TTL_MS);
  assert.ok(later?.fresh && later.code !== first?.code, "a new code once the old one expired");
  for (let i = 1; i < MAX_PENDING; i++) assert.ok(await book.codeFor(`s${i}`, "", {}, CODE_TTL_MS));
  assert.equal(await book.codeFor("one-too-many", "", {}, CODE_TTL_MS), undefined);
  // An approval of an expired code lets nobody in.
  const files = pairingFiles(stateFile);
  await mkdir(files.requests, { recursive: true });
  await writeFile(path.join(files.requests, requestFileName({ verb: "approve", code: later!.code })), "");
  assert.deepEqual(await book.takeRequests(3 * CODE_TTL_MS), []);
  assert.equal(book.isAllowed("s"), false);
});

async function waitUntil(done: () => Promise<boolean>, ms = 5000): Promise<void> {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 50)))
    if (await done()) return;
  assert.fail("timed out");
}
