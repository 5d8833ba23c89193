// The one rule troupe chat and the OpenAI endpoint show a message's text by, across a replay's gap.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { StreamedText } from "../../services/shared/streamed-text.js";

/** Feeds `steps` in order and returns everything shown. */
function show(steps: Array<(t: StreamedText) => string | void>): string {
  const t = new StreamedText();
  return steps.map((step) => step(t) ?? "").join("");
}

describe("StreamedText", () => {
  test("with no gap every delta shows at once and the end adds nothing", () => {
    const t = new StreamedText();
    t.start("m1", 5n);
    assert.equal(t.delta("m1", "Hel"), "Hel");
    assert.equal(t.delta("m1", "lo"), "lo");
    assert.equal(t.end("m1", "Hello"), "");
  });

  test("a gap in the middle of a message holds its later deltas; its end supplies the rest, once", () => {
    const out = show([
      (t) => t.start("m1", 5n),
      (t) => t.delta("m1", "The quick "),
      (t) => t.gap(9n),
      // A delta replayed after the gap: the ones between were lost, so this would leave a hole.
      (t) => t.delta("m1", "dog."),
      (t) => t.end("m1", "The quick brown fox jumps over the lazy dog."),
    ]);
    assert.equal(out, "The quick brown fox jumps over the lazy dog.");
  });

  test("a message that starts after the gap streams as usual", () => {
    const t = new StreamedText();
    t.start("m1", 5n);
    t.gap(9n);
    assert.equal(t.end("m1", "first"), "first");
    t.start("m2", 12n);
    assert.equal(t.delta("m2", "sec"), "sec");
    assert.equal(t.end("m2", "second"), "ond");
  });

  test("a message whose start fell in the gap is shown whole at its end", () => {
    const t = new StreamedText();
    t.gap(9n);
    assert.equal(t.delta("m7", "tail"), "");
    assert.equal(t.end("m7", "all of it, tail"), "all of it, tail");
  });

  test("an end that does not continue what was shown comes whole on a new line after a gap", () => {
    const t = new StreamedText();
    t.start("m1", 5n);
    t.delta("m1", "draft");
    t.gap(9n);
    assert.equal(t.end("m1", "final text"), "\nfinal text");
    // Without a gap, what was shown was every delta: nothing is added twice.
    const u = new StreamedText();
    u.start("m2", 5n);
    u.delta("m2", "draft");
    assert.equal(u.end("m2", "final text"), "");
  });

  test("a resumed run gives back what was shown of the messages it cut off, and forgets them", () => {
    const t = new StreamedText();
    t.start("m1", 5n);
    t.delta("m1", "done");
    t.end("m1", "done");
    t.start("m2", 8n);
    t.delta("m2", "cut o");
    assert.deepEqual(t.resumed(), ["cut o"]);
    assert.deepEqual(t.resumed(), []);
    t.start("m3", 15n);
    assert.equal(t.delta("m3", "again"), "again");
  });
});
