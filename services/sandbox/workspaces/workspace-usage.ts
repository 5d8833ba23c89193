// What each tenant keeps in the sandbox service's store, saved workspaces and snapshots together,
// against its workspaceMegabytes quota. Plain data: filled from the store's files at start and kept
// current by the store's own writes and removals (one service process owns its data directory).
export class WorkspaceUsage {
  private readonly byTenant = new Map<string, Map<string, number>>();

  set(tenant: string, item: string, bytes: number): void {
    let items = this.byTenant.get(tenant);
    if (!items) this.byTenant.set(tenant, (items = new Map()));
    items.set(item, bytes);
  }

  delete(tenant: string, item: string): void {
    const items = this.byTenant.get(tenant);
    items?.delete(item);
    if (items?.size === 0) this.byTenant.delete(tenant);
  }

  /** Bytes the tenant keeps. */
  of(tenant: string): number {
    let total = 0;
    for (const bytes of this.byTenant.get(tenant)?.values() ?? []) total += bytes;
    return total;
  }

  /** Bytes the tenant may still keep under `limit`, counting `replacing` (an item to be rewritten) as gone. */
  room(tenant: string, limit: number, replacing?: string): number {
    const current = replacing === undefined ? 0 : (this.byTenant.get(tenant)?.get(replacing) ?? 0);
    return Math.max(0, limit - (this.of(tenant) - current));
  }
}
