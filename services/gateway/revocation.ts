// The gateway's API keys, reloaded as the file changes, and its open streams by key, so that a
// revoked key's streams end at the next reload.
import { ApiKeys } from "../shared/auth/api-keys.js";
import type { Config } from "../shared/config/config-types.js";
import { RpcError, Status } from "../shared/errors.js";
import type { Logger } from "../shared/process/log.js";

/** The keys file, watched every 2 s; a revoked key's open streams end then, not when they next send. */
export async function watchedKeys(cfg: Config, logger: Logger): Promise<{ keys: ApiKeys; streams: StreamsByKey }> {
  const keys = await ApiKeys.load(cfg.apiKeysFile, cfg.apiKeysJson);
  keys.watch(2000, (err) =>
    logger.error("API keys file does not parse; keeping only the keys still named in it", {
      error: String((err as Error).message ?? err),
    }),
  );
  const streams = new StreamsByKey();
  keys.onRevoked(() => {
    const ended = streams.endRevoked((hash) => keys.holds(hash));
    if (ended > 0) logger.info(`ended ${ended} streams of revoked API keys`);
  });
  if (keys.size === 0)
    logger.warn(
      `no API keys configured: every call will be refused until one exists (troupe keys create, or ${cfg.apiKeysFile})`,
    );
  return { keys, streams };
}

/** Open streams by the hash of the key they came with, so a revoked key's streams end. */
export class StreamsByKey {
  private readonly byKey = new Map<string, Set<(err: RpcError) => void>>();

  /** Registers a stream's way to end; returns its removal. */
  add(keyHash: string, end: (err: RpcError) => void): () => void {
    let set = this.byKey.get(keyHash);
    if (!set) this.byKey.set(keyHash, (set = new Set()));
    set.add(end);
    return () => {
      set.delete(end);
      if (set.size === 0 && this.byKey.get(keyHash) === set) this.byKey.delete(keyHash);
    };
  }

  /** Ends every stream whose key is no longer accepted. */
  endRevoked(holds: (keyHash: string) => boolean): number {
    let ended = 0;
    for (const [hash, set] of [...this.byKey]) {
      if (holds(hash)) continue;
      this.byKey.delete(hash);
      for (const end of set) {
        end(new RpcError(Status.UNAUTHENTICATED, "this API key was revoked"));
        ended++;
      }
    }
    return ended;
  }
}
