// The one reading of page_size and page_token (services/shared/paging.ts) that the gateway's
// ListSessions and the runner's ReadHistory and ListStoredSessions share.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Status } from "../../services/shared/errors.js";
import { nextPageToken, pageOf } from "../../services/shared/paging.js";

test("a size of 0 means 100; a token is the offset it was issued for", () => {
  assert.deepEqual(pageOf(0, ""), { size: 100, offset: 0 });
  assert.deepEqual(pageOf(1000, "250"), { size: 1000, offset: 250 });
  assert.deepEqual(pageOf(7, "0"), { size: 7, offset: 0 });
});

test("a size out of range or a token not issued here: INVALID_ARGUMENT naming the field", () => {
  for (const size of [-1, 1001, 2 ** 31 - 1])
    assert.throws(() => pageOf(size, ""), { code: Status.INVALID_ARGUMENT, message: /page_size/ }, String(size));
  for (const token of ["abc", "-1", "1e3", " 5", "5 ", "1.5", "1234567890", "0x10"])
    assert.throws(() => pageOf(10, token), { code: Status.INVALID_ARGUMENT, message: /page_token/ }, token);
});

test("the next token walks every item once and ends with an empty token", () => {
  const items = Array.from({ length: 23 }, (_, i) => i);
  const seen: number[] = [];
  let token = "";
  do {
    const page = pageOf(10, token);
    seen.push(...items.slice(page.offset, page.offset + page.size));
    token = nextPageToken(page, items.length);
  } while (token !== "");
  assert.deepEqual(seen, items);
  assert.equal(nextPageToken(pageOf(10, "20"), 30), "", "a page that reaches the end exactly is the last");
  assert.equal(nextPageToken(pageOf(10, "0"), 0), "", "an empty list has one, empty, page");
});
