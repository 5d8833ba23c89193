// A background process's output and end, in-process (the process tool's end-to-end test, with a
// real sandbox, is in test/agent-reach.test.ts): what was read is not read again, output nobody
// read is bounded and its loss counted, split UTF-8 is joined, and waiting ends with the process.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BackgroundProcess } from "../../services/runner/tools/background.js";

test("output is read once, capped when unread, and UTF-8 split across chunks comes out whole", () => {
  const p = new BackgroundProcess("p1", "cmd");
  const euro = Buffer.from("€");
  p.append("stdout", euro.subarray(0, 1));
  p.append("stdout", Buffer.concat([euro.subarray(1), Buffer.from(" one\n")]));
  assert.equal(p.read(1000), "€ one\n");
  assert.equal(p.read(1000), "");
  p.append("stderr", Buffer.from("abcdef"));
  assert.equal(p.read(4), "abcd\n[2 more characters unread]");
  assert.equal(p.read(4), "ef");
  p.append("stdout", Buffer.alloc(300 * 1024, "x"));
  const big = p.read(10);
  assert.match(
    big,
    /^\[45056 characters of output were dropped unread\]\nxxxxxxxxxx\n\[262134 more characters unread\]$/,
  );
});

test("waiting ends when the process does, at the timeout, or on abort", async () => {
  const p = new BackgroundProcess("p2", "sleep");
  p.state = "running";
  const never = new AbortController().signal;
  assert.equal(await p.waitEnd(30, never), false);
  setTimeout(() => p.end("exited", 0), 20);
  assert.equal(await p.waitEnd(5000, never), true);
  assert.match(p.describe(), /^p2: exited 0 after \d+ s; 0 characters unread; "sleep"$/);
  p.end("killed", 137); // a second end changes nothing
  assert.equal(p.state, "exited");
  const q = new BackgroundProcess("p3", "x");
  const abort = new AbortController();
  setTimeout(() => abort.abort(), 20);
  assert.equal(await q.waitEnd(5000, abort.signal), false);
});
