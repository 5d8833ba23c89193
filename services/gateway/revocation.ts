// Open streams by API key, so that a revoked key's streams end at the next reload of the keys.
import { RpcError, Status } from "../shared/errors.js";

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
