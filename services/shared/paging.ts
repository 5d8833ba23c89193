// The one reading of page_size and page_token for every List and Read method that pages. A size
// of 0 means 100 and at most 1,000 may be asked; a token is an offset this service issued, so
// anything else is INVALID_ARGUMENT rather than a silently empty page.
import { invalidArgument } from "./errors.js";

export interface Page {
  size: number;
  offset: number;
}

const DEFAULT_PAGE_SIZE = 100;
const MAX_PAGE_SIZE = 1000;

/** The page a request asks for; throws INVALID_ARGUMENT for a size out of range or a token not issued here. */
export function pageOf(pageSize: number, pageToken: string): Page {
  if (pageSize < 0 || pageSize > MAX_PAGE_SIZE)
    throw invalidArgument(`page_size must be between 0 and ${MAX_PAGE_SIZE}`);
  if (pageToken !== "" && !/^\d{1,9}$/.test(pageToken))
    throw invalidArgument("page_token is not one this service issued");
  return { size: pageSize === 0 ? DEFAULT_PAGE_SIZE : pageSize, offset: pageToken === "" ? 0 : Number(pageToken) };
}

/** The token for the page after `page` out of `total` items, or "" when `page` is the last. */
export function nextPageToken(page: Page, total: number): string {
  return page.offset + page.size < total ? String(page.offset + page.size) : "";
}
