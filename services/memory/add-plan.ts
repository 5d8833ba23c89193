// What one group commit of adds will write (store.ts, group-commit.ts): each caller's request
// and answer, and the rows planned from them, by kind, with who asked.
import type { MemoryRow } from "./memory-schema.js";

export type AddOutcome = { id: string; outcome: "added" | "updated" | "duplicate" };
export interface AddRequest {
  scopeWhere: string;
  rows: MemoryRow[];
  upsertIds: Set<string>;
  actor: string;
}

/** Rows a group will write, by kind, with who asked and (for an update) the row it replaces. */
export class PlannedWrites {
  readonly inserts: PlannedRow[] = [];
  readonly updates: PlannedRow[] = [];
  readonly ids = new Set<string>();
  readonly hashes = new Set<string>();

  plan(row: MemoryRow, actor: string, before?: PlannedRow["before"]): void {
    (before ? this.updates : this.inserts).push({ row, actor, before });
    this.ids.add(row.id);
    this.hashes.add(row.content_hash);
  }
}
export interface PlannedRow {
  row: MemoryRow;
  actor: string;
  before?: Pick<MemoryRow, "id" | "text" | "created">;
}
