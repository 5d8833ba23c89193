// The inbox cursor: what is encoded comes back; anything else is INVALID_ARGUMENT, never a crash.
import { test } from "node:test";
import assert from "node:assert/strict";
import { decodeCursor, encodeCursor } from "../../services/gateway/inbox-cursor.js";
import { Status, grpcCode } from "../../services/shared/errors.js";

test("a cursor round-trips; empty is the start", () => {
  const cursor = { watermarkMs: 1_764_000_000_000, seqs: new Map([["agent:main:telegram:direct:42", 17]]) };
  assert.deepEqual(decodeCursor(encodeCursor(cursor)), cursor);
  assert.deepEqual(decodeCursor(""), { watermarkMs: 0, seqs: new Map() });
});

test("a cursor not issued here is INVALID_ARGUMENT", () => {
  const b64 = (v: unknown) => `i1.${Buffer.from(JSON.stringify(v)).toString("base64url")}`;
  for (const bad of [
    "x",
    "i1.@@",
    "i1.bm90IGpzb24",
    b64(null),
    b64({ w: 1.5, s: [] }),
    b64({ w: 1, s: [["../etc", 1]] }),
    b64({ w: 1, s: [["ok", -1]] }),
    b64({ w: 1, s: [["ok"]] }),
    b64({ w: 1, s: {} }),
  ]) {
    assert.throws(
      () => decodeCursor(bad),
      (err) => grpcCode(err) === Status.INVALID_ARGUMENT,
      bad,
    );
  }
});
