// The snapshot stores by URL scheme. Adding one is a file implementing SnapshotStore
// (snapshot-store.ts) and one line in STORES.
import path from "node:path";
import { fileURLToPath } from "node:url";
import { invalidArgument } from "../../shared/errors.js";
import { bucketStore } from "./snapshot-bucket.js";
import { directoryStore } from "./snapshot-directory.js";
import type { SnapshotStore, StoreContext } from "./snapshot-store.js";

const STORES: Record<string, (url: URL, ctx: StoreContext) => SnapshotStore> = {
  "file:": (url, ctx) => directoryStore(fileURLToPath(url), ctx),
  "s3:": bucketStore,
};

/**
 * The store a TROUPE_SANDBOX_SNAPSHOTS value names: "" (the data directory's snapshots/), an
 * absolute path or file:// URL, or s3://bucket[/prefix][?region=&endpoint=&path-style=].
 */
export function snapshotStoreOf(setting: string, ctx: StoreContext): SnapshotStore {
  if (setting === "") return directoryStore(path.join(ctx.dataDir, "snapshots"), ctx);
  if (path.isAbsolute(setting)) return directoryStore(setting, ctx);
  let url: URL;
  try {
    url = new URL(setting);
  } catch {
    throw invalidArgument(`TROUPE_SANDBOX_SNAPSHOTS: "${setting}" is neither an absolute path nor a URL`);
  }
  const make = STORES[url.protocol];
  if (!make)
    throw invalidArgument(
      `TROUPE_SANDBOX_SNAPSHOTS: no snapshot store for ${url.protocol}// (known: ${Object.keys(STORES).join(", ")})`,
    );
  return make(url, ctx);
}
