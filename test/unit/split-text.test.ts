// Telegram's 4096-character limit: a long reply is split at a line or word break, never inside a
// surrogate pair, and its parts put back together are the reply.
import { test } from "node:test";
import assert from "node:assert/strict";
import { splitText as split } from "../../services/adapter/drafted-replies.js";

const splitText = (text: string) => split(text, 4096);

test("short text is one part; long text splits at breaks within the limit", () => {
  assert.deepEqual(splitText("hello"), ["hello"]);
  const words = Array.from({ length: 2000 }, (_, i) => `word${i}`).join(" ");
  const parts = splitText(words);
  assert.ok(parts.length >= 3 && parts.every((p) => p.length <= 4096 && !p.startsWith(" ")));
  assert.equal(parts.join(" "), words);
  const lines = Array.from({ length: 500 }, (_, i) => `line ${i} of the answer`).join("\n");
  assert.equal(splitText(lines).join("\n"), lines);
});

test("text without breaks is cut at the limit, but not between the halves of a surrogate pair", () => {
  const emoji = "😀".repeat(3000); // 6000 UTF-16 units
  const parts = splitText(emoji);
  assert.ok(parts.every((p) => p.length <= 4096 && !/^[\udc00-\udfff]/.test(p) && !/[\ud800-\udbff]$/.test(p)));
  assert.equal(parts.join(""), emoji);
});
