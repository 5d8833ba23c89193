// The warm pool, one per image: sandboxes started, greeted and unclaimed, tenant-neutral. Plain
// data; the fleet decides when to fill and claim (fleet.ts).
export interface Pooled {
  readonly id: string;
}

export class WarmPools<S extends Pooled> {
  private readonly byImage = new Map<string, S[]>();

  /** Takes the oldest sandbox of the image's pool; undefined when it is empty. */
  take(image: string): S | undefined {
    return this.byImage.get(image)?.shift();
  }

  add(image: string, sandbox: S): void {
    let pool = this.byImage.get(image);
    if (!pool) this.byImage.set(image, (pool = []));
    pool.push(sandbox);
  }

  /** Sandboxes in the image's pool. */
  sizeOf(image: string): number {
    return this.byImage.get(image)?.length ?? 0;
  }

  /** Sandboxes in every pool. */
  get size(): number {
    let n = 0;
    for (const pool of this.byImage.values()) n += pool.length;
    return n;
  }

  all(): S[] {
    return [...this.byImage.values()].flat();
  }

  /** Takes the sandbox of this container out of its pool; it, when it was pooled. */
  remove(id: string): S | undefined {
    for (const pool of this.byImage.values()) {
      const i = pool.findIndex((s) => s.id === id);
      if (i >= 0) return pool.splice(i, 1)[0];
    }
    return undefined;
  }

  /** Empties the pools of every image not in `wanted`; what they held. */
  dropExcept(wanted: ReadonlySet<string>): S[] {
    const dropped: S[] = [];
    for (const [image, pool] of this.byImage)
      if (!wanted.has(image)) {
        dropped.push(...pool);
        this.byImage.delete(image);
      }
    return dropped;
  }

  /** Empties every pool; what they held. */
  clear(): S[] {
    const all = this.all();
    this.byImage.clear();
    return all;
  }
}
