// Which sessions go with a deleted one (runner/retention.ts): every sub-agent below it, however
// deep, and nothing else; and a listing hides a sub-agent whose parent is gone.
import { test } from "node:test";
import assert from "node:assert/strict";
import { descendantsOf, withoutOrphans } from "../../services/runner/retention.js";
import type { StoredSession } from "../../services/runner/session/session-log.js";

const owner = { tenant: "t", principal: "p" };
const session = (sessionId: string, parentSessionId?: string): StoredSession => ({
  sessionId,
  agentId: "main",
  owner,
  createdMs: 0,
  updateMs: 0,
  ...(parentSessionId ? { parentSessionId } : {}),
});

test("descendants: children, grandchildren, nearest first; not siblings, not the session itself", () => {
  const all = [
    session("a"),
    session("a:sub:1", "a"),
    session("a:sub:2", "a"),
    session("a:sub:1:sub:x", "a:sub:1"),
    session("b"),
    session("b:sub:1", "b"),
    // A loop (a damaged store) ends, and does not bring the root back.
    session("loop", "loop:2"),
    session("loop:2", "loop"),
  ];
  assert.deepEqual(
    descendantsOf("a", all).map((s) => s.sessionId),
    ["a:sub:1", "a:sub:2", "a:sub:1:sub:x"],
  );
  assert.deepEqual(descendantsOf("a:sub:2", all), []);
  assert.deepEqual(
    descendantsOf("loop", all).map((s) => s.sessionId),
    ["loop:2"],
  );
});

test("a listing hides sub-agents whose parent is gone, and keeps the rest", () => {
  const all = [session("a"), session("a:sub:1", "a"), session("gone:sub:1", "gone"), session("b")];
  assert.deepEqual(
    withoutOrphans(all).map((s) => s.sessionId),
    ["a", "a:sub:1", "b"],
  );
});
