// Packages a process may never use, loaded on first use instead of at start: an SDK for a provider
// nobody configured, PostgreSQL under the file store, the HTML converter before the first fetch.
// Each costs megabytes of resident memory once loaded (bench/history.md, footprint), and the
// constructors that need them are synchronous, so these are CommonJS requires, made once.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

/** The package's (or, by an absolute path, the file's) exports on first call, the same object after. */
export function lazyModule<T>(name: string): () => T {
  let loaded: T | undefined;
  return () => (loaded ??= require(name) as T);
}
