// A memory as stored: its row, the table's Arrow schema (and the payload column that carries a row
// as JSON), its history rows, the text hash that dedupes, and the columns searches read.
import { createHash } from "node:crypto";
import {
  Bool,
  Field,
  FixedSizeList,
  Float32,
  Float64,
  Int32,
  Schema,
  type Table as ArrowTable,
  Timestamp,
  TimeUnit,
  Utf8,
} from "apache-arrow";
import { MemoryKind } from "../shared/gen/troupe/v1/memory_pb.js";
import { newId } from "../shared/ids.js";
import { arrowTable } from "./columns.js";
import type { Candidate } from "./ranking.js";

export interface MemoryRow {
  id: string;
  tenant: string;
  owner: string;
  agent_id: string;
  session_id: string;
  kind: number;
  text: string;
  vector: Float32Array | number[];
  created: number;
  updated: number;
  content_hash: string;
  importance: number;
  evergreen: boolean;
  provenance: string;
  /** JSON object of string values. */
  metadata: string;
  embedder: string;
}

/** A row with the defaults of a memory nobody said more about: a fact of middling importance, made now. */
export function newMemoryRow(
  fields: Pick<MemoryRow, "tenant" | "owner" | "agent_id" | "text" | "vector" | "embedder"> & Partial<MemoryRow>,
): MemoryRow {
  const now = Date.now();
  return {
    id: newId(),
    session_id: "",
    kind: MemoryKind.FACT,
    created: now,
    updated: now,
    content_hash: contentHash(fields.text),
    importance: 0.5,
    evergreen: false,
    provenance: "",
    metadata: "{}",
    ...fields,
  };
}

export const historySchema = new Schema([
  new Field("memory_id", new Utf8(), false),
  new Field("tenant", new Utf8(), false),
  new Field("owner", new Utf8(), false),
  new Field("agent_id", new Utf8(), false),
  new Field("event", new Int32(), false),
  new Field("old_text", new Utf8(), false),
  new Field("new_text", new Utf8(), false),
  new Field("time", new Timestamp(TimeUnit.MILLISECOND), false),
  new Field("actor", new Utf8(), false),
]);

/** What happened to a memory (the MemoryEvent numbers of the wire contract). */
export const EVENT = { add: 1, update: 2, delete: 3 } as const;

export function historyRow(
  r: Pick<MemoryRow, "id" | "tenant" | "owner" | "agent_id">,
  event: number,
  oldText: string,
  newText: string,
  time: number,
  actor: string,
): HistoryRow {
  return {
    memory_id: r.id,
    tenant: r.tenant,
    owner: r.owner,
    agent_id: r.agent_id,
    event,
    old_text: oldText,
    new_text: newText,
    time,
    actor,
  };
}

export interface HistoryRow {
  memory_id: string;
  tenant: string;
  owner: string;
  agent_id: string;
  event: number;
  old_text: string;
  new_text: string;
  time: number;
  actor: string;
}

/**
 * The memory table's columns. `payload` holds the memory again, as JSON of its MEMORY_COLUMNS,
 * computed from the other columns at every write (memoryArrow): the candidate searches read it
 * and the vector instead of fourteen columns (PACKED_CANDIDATE_COLUMNS says why). Tables made
 * before it existed have no payload (`packed` false) until their next rewrite.
 */
export function schemaFor(dim: number, packed = true): Schema {
  return new Schema([
    new Field("id", new Utf8(), false),
    new Field("tenant", new Utf8(), false),
    new Field("owner", new Utf8(), false),
    new Field("agent_id", new Utf8(), false),
    new Field("session_id", new Utf8(), false),
    new Field("kind", new Int32(), false),
    new Field("text", new Utf8(), false),
    new Field("vector", new FixedSizeList(dim, new Field("item", new Float32(), true)), false),
    new Field("created", new Timestamp(TimeUnit.MILLISECOND), false),
    new Field("updated", new Timestamp(TimeUnit.MILLISECOND), false),
    new Field("content_hash", new Utf8(), false),
    new Field("importance", new Float64(), false),
    new Field("evergreen", new Bool(), false),
    new Field("provenance", new Utf8(), false),
    new Field("metadata", new Utf8(), false),
    new Field("embedder", new Utf8(), false),
    ...(packed ? [new Field("payload", new Utf8(), false)] : []),
  ]);
}

/** Whether a memory table of this schema has payloads (schemaFor). */
export const hasPayload = (schema: Schema): boolean => schema.fields.some((f) => f.name === "payload");

/** A memory's payload: its MEMORY_COLUMNS as JSON, times as milliseconds. */
export function payloadOf(row: Record<string, unknown>): string {
  const memory: Record<string, unknown> = {};
  for (const c of MEMORY_COLUMNS) {
    const v = row[c];
    memory[c] = c === "created" || c === "updated" ? Number(v) : v;
  }
  return JSON.stringify(memory);
}

/**
 * Memory rows as Arrow columns of `schema`, the payload computed from the row's own columns when
 * the schema has one. Every write of the memory table goes through here, so a payload never
 * disagrees with its row.
 */
export function memoryArrow(schema: Schema, rows: readonly object[]): ArrowTable {
  if (!hasPayload(schema)) return arrowTable(schema, rows);
  // Rows may be Arrow row proxies (a copy from another table): their fields are read by name.
  const names = schema.fields.map((f) => f.name);
  return arrowTable(
    schema,
    rows.map((r) => {
      const row = r as Record<string, unknown>;
      return Object.fromEntries(names.map((n) => [n, n === "payload" ? payloadOf(row) : row[n]]));
    }),
  );
}

/** Case, spacing and Unicode form do not make two memories different. */
export function contentHash(text: string): string {
  return createHash("sha256").update(text.normalize("NFKC").toLowerCase().replace(/\s+/g, " ").trim()).digest("hex");
}

/** A string literal of LanceDB's filter language. Values are checked against a strict alphabet first; this is the second wall. */
export const sqlString = (s: string): string => `'${s.replace(/'/g, "''")}'`;

/**
 * The content hashes that may be stored: no false negatives, about one false positive in 100,000.
 * A batch of new texts would otherwise ask the table about each hash, and that query scans every
 * row the content_hash index has not caught up with yet: at 300,000 rows it took 320 ms of each
 * 1,000-row batch and grew with the table. With the filter, only hashes it may hold are asked
 * about. Built from the table when first needed; kept current by this process's writes (the only
 * writer of the table); deletes leave their hash in (a false positive, which the query settles).
 */
export class HashFilter {
  private readonly bits: Uint32Array;
  private readonly m: number;
  private static readonly K = 17;
  size = 0;

  constructor(readonly capacity: number) {
    // 24 bits per item and 17 probes: a false-positive rate of about 1e-5 at capacity.
    this.m = Math.max(1024, capacity * 24);
    this.bits = new Uint32Array(Math.ceil(this.m / 32));
  }

  /** Probe positions by double hashing on two words of the (already uniform) SHA-256 hex. */
  private *probes(hex: string): Generator<number> {
    const h1 = Number.parseInt(hex.slice(0, 8), 16) >>> 0;
    const h2 = (Number.parseInt(hex.slice(8, 16), 16) | 1) >>> 0;
    for (let i = 0; i < HashFilter.K; i++) yield ((h1 + Math.imul(i, h2)) >>> 0) % this.m;
  }

  add(hex: string): void {
    for (const p of this.probes(hex)) this.bits[p >>> 5] |= 1 << (p & 31);
    this.size++;
  }

  mayHave(hex: string): boolean {
    for (const p of this.probes(hex)) if ((this.bits[p >>> 5] & (1 << (p & 31))) === 0) return false;
    return true;
  }
}

/** A memory as readers see it (get()). */
export type StoredMemory = Omit<MemoryRow, "vector" | "embedder">;
export const MEMORY_COLUMNS = [
  "id",
  "tenant",
  "owner",
  "agent_id",
  "session_id",
  "kind",
  "text",
  "created",
  "updated",
  "content_hash",
  "importance",
  "evergreen",
  "provenance",
  "metadata",
] satisfies (keyof StoredMemory)[];
/**
 * The columns the candidate searches return: each candidate's whole memory, and its vector for
 * MMR. The winners then need no read of their own after ranking, and what a search returns is
 * what ranking saw, from one version of the table. The searches read their rows in the same pass
 * as the rest of their work, while a separate read of the winners pays another LanceDB call (about
 * 1.5 ms here) and waits for ranking. Both searches in parallel, pools of 40, 2 cores, warm page
 * cache (four ranking columns / whole rows / four columns then the ten winners' rows by address):
 *
 * - 1M memories in scope order: 13.1 / 17.7 / 19.9 ms; the whole search 1.2 to 2.2 ms faster;
 * - 300k in scope order: 11.1 / 15.1 / 17.3 ms;
 * - 300k in write order, compacted but never rewritten: 16.5 / 34.4 / 32.8 ms. Here whole rows
 *   cost a little more, but the store keeps most of a large table in scope order (relayout()).
 */
export const CANDIDATE_COLUMNS = [...MEMORY_COLUMNS, "vector"];
/**
 * What the candidate searches read from a table with payloads. LanceDB reads each column of the
 * 40 candidates on its own: on a million memories in scope order, exact search of an owner's
 * scope took 10.8 to 10.9 ms for id, vector and payload against 12.7 ms for the fourteen columns
 * and the vector, the full-text search 4.8 to 4.9 ms against 6.4, and both in parallel 11.7 to
 * 12.1 ms against 14.4 to 15.1 (100 queries, alternating tables).
 */
export const PACKED_CANDIDATE_COLUMNS = ["payload", "vector"];
/** A candidate as a search of one scope found it, with its whole memory as that search read it. */
export type StoredCandidate = Candidate & { memory: StoredMemory };
