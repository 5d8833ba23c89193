// The commit of one group of adds (group-commit.ts gathers them; add-plan.ts holds what a group
// will write): each caller's rows checked against what the scope already holds, duplicates
// answered with the id stored, an id of another scope refused, the rest written in at most three
// LanceDB commits (new rows, updates, their history). Runs inside the table's one writer.
import { RpcError, Status } from "../shared/errors.js";
import { type AddOutcome, type AddRequest, PlannedWrites } from "./add-plan.js";
import type { Settled } from "./group-commit.js";
import type { MemoryTable } from "./memory-table.js";
import { EVENT, HashFilter, type MemoryRow, historyRow, memoryArrow, sqlString } from "./memory-schema.js";

export class AddCommit {
  /** Content hashes the table may hold (built at the first commit, kept up to date by each). */
  private hashes?: HashFilter;

  constructor(private readonly mt: MemoryTable) {}

  /**
   * One group's commit. A caller's own refusal (a foreign id) fails that caller alone. A caller
   * whose rows carry an id or a text an earlier caller of the group is writing is planned after
   * those are committed, so its lookups see them as the one-at-a-time writer's would have.
   */
  async commit(group: AddRequest[]): Promise<Settled<AddOutcome[]>[]> {
    const filter = await this.hashFilter(group.reduce((n, r) => n + r.rows.length, 0));
    let batch = new PlannedWrites();
    const settled: Settled<AddOutcome[]>[] = [];
    for (const { scopeWhere, rows, upsertIds, actor } of group) {
      if (rows.some((r) => batch.ids.has(r.id) || batch.hashes.has(r.content_hash))) {
        await this.commitPlanned(batch, filter);
        batch = new PlannedWrites();
      }
      const { byHash, byId: present } = await this.existing(
        scopeWhere,
        [...new Set(rows.map((r) => r.content_hash).filter((h) => filter.mayHave(h)))],
        [...upsertIds],
      );
      // An id given for a memory of another scope is refused rather than silently forked.
      const foreign = await this.foreignId(upsertIds, present);
      if (foreign !== undefined) {
        settled.push({ error: new RpcError(Status.PERMISSION_DENIED, `memory ${foreign} belongs to another scope`) });
        continue;
      }
      const seen = new Map<string, string>();
      const out = rows.map((r) => {
        const same = byHash.get(r.content_hash) ?? seen.get(r.content_hash);
        if (same !== undefined && !(upsertIds.has(r.id) && same === r.id))
          return { id: same, outcome: "duplicate" as const };
        seen.set(r.content_hash, r.id);
        const before = upsertIds.has(r.id) ? present.get(r.id) : undefined;
        batch.plan(r, actor, before);
        return { id: r.id, outcome: before ? ("updated" as const) : ("added" as const) };
      });
      settled.push({ ok: out });
    }
    await this.commitPlanned(batch, filter);
    return settled;
  }

  /** Existing rows of a scope with these content hashes or ids: hash -> id, and the rows by id. */
  private async existing(
    scopeWhere: string,
    hashes: string[],
    ids: string[],
  ): Promise<{ byHash: Map<string, string>; byId: Map<string, Pick<MemoryRow, "id" | "text" | "created">> }> {
    const parts: string[] = [];
    if (hashes.length > 0) parts.push(`content_hash IN (${hashes.map(sqlString).join(", ")})`);
    if (ids.length > 0) parts.push(`id IN (${ids.map(sqlString).join(", ")})`);
    const byHash = new Map<string, string>();
    const byId = new Map<string, Pick<MemoryRow, "id" | "text" | "created">>();
    if (parts.length === 0) return { byHash, byId };
    const rows = (await this.mt.table
      .query()
      .where(`${scopeWhere} AND (${parts.join(" OR ")})`)
      .select(["id", "content_hash", "text", "created"])
      .toArray()) as (Pick<MemoryRow, "id" | "text" | "created"> & { content_hash: string })[];
    for (const r of rows) {
      byHash.set(r.content_hash, r.id);
      byId.set(r.id, r);
    }
    return { byHash, byId };
  }

  /** The hash filter, (re)built from the table when missing or full. Called inside the writer's queue. */
  private async hashFilter(adding: number): Promise<HashFilter> {
    if (this.hashes && this.hashes.size + adding <= this.hashes.capacity) return this.hashes;
    const rows = await this.mt.table.countRows();
    const filter = new HashFilter(Math.max(1 << 20, 2 * (rows + adding)));
    for await (const batch of this.mt.table.query().select(["content_hash"])) {
      const column = batch.getChild("content_hash");
      for (let i = 0; i < batch.numRows; i++) filter.add(String(column?.get(i)));
    }
    this.hashes = filter;
    return filter;
  }

  /** Commits planned rows: new ones in one commit, updates in one more, their history in a third. */
  private async commitPlanned(batch: PlannedWrites, filter: HashFilter): Promise<void> {
    const { inserts, updates } = batch;
    if (inserts.length > 0)
      await this.mt.table.add(
        memoryArrow(
          this.mt.schema,
          inserts.map((p) => p.row),
        ),
      );
    this.mt.approxRows += inserts.length;
    const written = [...inserts, ...updates];
    for (const { row } of written) filter.add(row.content_hash);
    if (updates.length > 0) {
      // An update keeps when the memory was first made.
      const kept = updates.map((u) => ({ ...u.row, created: Number(u.before!.created) }));
      await this.mt.table
        .mergeInsert("id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute(memoryArrow(this.mt.schema, kept));
    }
    // Noted for a rewrite only once committed: a rewrite that began before this point notes
    // them here, and one that begins after takes its snapshot after the commit. Noted before the
    // update's commit, an update could fall between the two: not noted (no rewrite yet) and
    // not in a snapshot taken before its commit, and so lost from the copy.
    for (const { row } of written) this.mt.changedDuringCopy?.add(row.id);
    const now = Date.now();
    await this.mt.recordHistory([
      ...inserts.map((p) => historyRow(p.row, EVENT.add, "", p.row.text, now, p.actor)),
      ...updates.map((u) => historyRow(u.row, EVENT.update, u.before!.text, u.row.text, now, u.actor)),
    ]);
  }

  /** An id among `ids` that no row of the scope has but a row of another scope does. */
  private async foreignId(ids: Set<string>, present: Map<string, unknown>): Promise<string | undefined> {
    for (const id of ids) {
      if (!present.has(id) && (await this.mt.table.countRows(`id = ${sqlString(id)}`)) > 0) return id;
    }
    return undefined;
  }
}
